"""The calibration run measures real steps and fits a profile the simulator can load."""

from __future__ import annotations

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
    profile, report = calibrate(rows, load_profile("cpu-smollm2"), name="tiny")
    assert report.n == len(rows)
    # Timings on a shared machine are noise at this size: check the fit is usable
    # (non-negative, monotone), not its values; the fit itself is tested in tests/sim.
    step = profile.step
    assert min(step.base_s, step.per_prefill_token_s, step.per_decode_seq_s, step.per_context_token_s) >= 0
    assert step.step_time(64, 4, 400) >= step.step_time(0, 1, 10) > 0
    assert eng.kv.num_free_blocks == eng.kv.num_blocks
