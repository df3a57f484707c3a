import json

import numpy as np
import pytest

from llmserve.sim.calibrate import calibrate, fit_step_model, read_measurements
from llmserve.sim.profile import BUILTIN_PROFILES, InstanceProfile, StepModel, load_profile, save_profile


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_profiles_load(name):
    p = load_profile(name)
    assert p.name == name and p.step.step_time(0, 1, 100) > 0
    assert p.max_num_batched_tokens >= p.max_num_seqs


def test_h100_cold_start_is_minutes():
    assert 60.0 <= load_profile("h100-8b").cold_start_s <= 180.0


def test_json_round_trip_and_cold_start_override(tmp_path):
    p = load_profile("h100-8b")
    path = tmp_path / "p.json"
    save_profile(p, path)
    assert load_profile(str(path)) == p
    q = p.with_cold_start(60.0)
    assert q.cold_start_s == 60.0 and q.warmup_s == pytest.approx(p.warmup_s / 2)
    with pytest.raises(ValueError):
        InstanceProfile.from_dict({**json.loads(p.to_json()), "bogus": 1})
    with pytest.raises(ValueError):
        load_profile("no-such-profile")


def test_saturation_estimate_is_close_to_a_full_batch_by_hand():
    p = InstanceProfile("x", StepModel(0.01, 0.0, 0.001, 0.0), max_num_seqs=10, max_num_batched_tokens=64)
    # Decode-only requests: a full batch of 10 takes 0.02 s per step -> 500 tokens/s.
    assert p.saturation_tokens_per_s(prompt_tokens=0, output_tokens=100) == pytest.approx(500.0)


def synthetic(n=400, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    true = StepModel(0.02, 3e-4, 4e-3, 2e-6)
    rows = []
    for _ in range(n):
        pre, dec, ctx = rng.integers(0, 512), rng.integers(0, 16), rng.integers(0, 20_000)
        t = true.step_time(pre, dec, ctx) * (1 + noise * rng.standard_normal())
        rows.append((pre, dec, ctx, max(t, 1e-6)))
    return true, rows


def test_fit_recovers_known_coefficients():
    true, rows = synthetic()
    model, fit = fit_step_model(rows)
    for name in ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s"):
        assert getattr(model, name) == pytest.approx(getattr(true, name), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_fit_with_noise_is_close():
    true, rows = synthetic(noise=0.05, seed=1)
    model, fit = fit_step_model(rows)
    assert model.base_s == pytest.approx(true.base_s, rel=0.15)
    assert model.per_prefill_token_s == pytest.approx(true.per_prefill_token_s, rel=0.1)
    assert fit.mean_abs_rel_error < 0.08


def test_a_coefficient_the_plain_fit_makes_negative_is_zero_and_the_rest_are_refitted():
    rng = np.random.default_rng(2)
    pre, dec, ctx = rng.integers(0, 512, 200), rng.integers(0, 16, 200), rng.integers(0, 20_000, 200)
    # Time falls with the prompt: the plain fit's prefill slope is negative.
    seconds = 0.02 + 4e-3 * dec + 2e-6 * ctx - 1e-5 * pre + 1e-4 * rng.standard_normal(200)
    x = np.column_stack([np.ones(200), pre, dec, ctx])
    plain, *_ = np.linalg.lstsq(x, seconds, rcond=None)
    assert plain[1] < 0
    model, fit = fit_step_model(zip(pre, dec, ctx, seconds))
    assert model.per_prefill_token_s == 0.0
    # The others are the least-squares fit without that column, not the plain fit clamped.
    refit, *_ = np.linalg.lstsq(x[:, [0, 2, 3]], seconds, rcond=None)
    got = [model.base_s, model.per_decode_seq_s, model.per_context_token_s]
    assert got == pytest.approx(list(refit), rel=1e-9)
    assert got != pytest.approx([plain[0], plain[2], plain[3]], rel=1e-3)


def test_calibrate_keeps_the_template_limits_and_reads_csv(tmp_path):
    _, rows = synthetic(50)
    path = tmp_path / "steps.csv"
    path.write_text("prefill_tokens,decode_seqs,sum_context,seconds\n" + "".join(
        f"{a},{b},{c},{d}\n" for a, b, c, d in rows))
    template = load_profile("cpu-smollm2")
    prof, fit = calibrate(read_measurements(path), template, name="mine")
    assert prof.name == "mine" and prof.max_num_seqs == template.max_num_seqs
    assert prof.step.base_s == pytest.approx(0.02, rel=1e-6) and "fitted" in prof.source
    with pytest.raises(ValueError):
        fit_step_model(rows[:3])
