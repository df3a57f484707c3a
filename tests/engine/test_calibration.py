"""The calibration run measures real steps and fits a profile the simulator can load."""

from __future__ import annotations

import numpy as np
import pytest

from llmserve.engine.calibration import measure_steps
from llmserve.sim.calibrate import calibrate
from llmserve.sim.profile import load_profile


def test_measured_steps_fit_a_profile(tiny):
    eng = tiny.engine(num_kv_blocks=256, max_num_batched_tokens=64, max_num_seqs=8)
    rows = measure_steps(eng, prefill_sizes=(8, 32, 64), decode_batches=(1, 4), decode_steps=3)
    assert any(r[0] > 0 and r[1] == 0 for r in rows)  # prefill-only steps
    assert any(r[0] == 0 and r[1] == 4 for r in rows)  # decode-only steps at batch 4
    assert any(r[0] > 0 and r[1] > 0 for r in rows)  # mixed steps
    assert all(r[3] > 0 for r in rows)
    # The first steps are the prefills asked for, each whole: the token budget (64) holds it.
    assert [r[0] for r in rows if r[1] == 0][:3] == [8, 32, 64]
    profile, report = calibrate(rows, load_profile("cpu-smollm2"), name="tiny")
    assert report.n == len(rows)
    # Timings on a shared machine are noise at this size, so not the values: that the
    # profile the simulator loads is the fit that was reported (its error, recomputed).
    step = profile.step
    predicted = np.array([step.step_time(int(a), int(b), int(c)) for a, b, c, _ in rows])
    seconds = np.array([r[3] for r in rows])
    assert np.sqrt(np.mean((seconds - predicted) ** 2)) == pytest.approx(report.rmse_s, rel=1e-9)
    assert step.base_s > 0  # the fit keeps a cost per step (calibrate.nonneg_fit never drops it)
    assert eng.kv.num_free_blocks == eng.kv.num_blocks
