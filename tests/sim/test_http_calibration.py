"""Fitting a profile to what a client saw through HTTP: overhead, step model and core sharing."""

import random

import pytest

from llmserve.sim.http_calibration import Observation, decode_step, fit_http
from llmserve.fidelity.http_measure import burst_trace, pinned_pool
from llmserve.sim.profile import InstanceProfile, StepModel
from llmserve.sim.sharing import CoreSharing

TRUE = StepModel(base_s=0.03, per_prefill_token_s=0.004, per_decode_seq_s=0.005, per_context_token_s=2e-5)
TEMPLATE = InstanceProfile("t", StepModel(1.0, 0, 0, 0), max_num_seqs=4, max_num_batched_tokens=512,
                           cold_start_s=0.0, warmup_s=0.0)


def observe(busy, n, p, o, overhead, slowdown=1.0, noise=0.0, rng=None):
    jitter = (lambda: 1 + rng.uniform(-noise, noise)) if rng else (lambda: 1.0)
    ttft = overhead + slowdown * TRUE.step_time(n * p, 0, n * p)
    tpot = slowdown * TRUE.step_time(0, n, int(n * (p + o / 2)))
    return Observation(busy, n, p, o, ttft * jitter(), tpot * jitter())


def grid(busy=1, overhead=0.05, slowdown=1.0, noise=0.0, seed=0):
    rng = random.Random(seed) if noise else None
    return [observe(busy, n, p, 16, overhead, slowdown, noise, rng)
            for n in (1, 2, 4) for p in (16, 96) for _ in range(n)]


def test_exact_observations_give_back_the_step_model_and_overhead():
    fit = fit_http(grid(), TEMPLATE, cores=2, threads=1)
    s = fit.profile.step
    assert s.base_s == pytest.approx(TRUE.base_s, rel=1e-6)
    assert s.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=1e-6)
    assert s.per_decode_seq_s == pytest.approx(TRUE.per_decode_seq_s, rel=1e-6)
    assert fit.profile.request_overhead_s == pytest.approx(0.05, rel=1e-6)
    assert fit.profile.sharing == CoreSharing(2, 1, 0.0)  # not measured: threads against cores
    assert fit.profile.max_num_seqs == 4  # the template's limits stay


def test_two_busy_at_a_known_slowdown_fit_its_api_share():
    obs = grid() + grid(busy=2, slowdown=1.3)
    fit = fit_http(obs, TEMPLATE, cores=2, threads=1)
    assert fit.sharing_ratio == pytest.approx(1.3, rel=1e-6)
    assert fit.profile.sharing.api_share == pytest.approx(0.3, rel=1e-6)
    assert fit.profile.sharing.slowdown(2) == pytest.approx(1.3, rel=1e-6)


def test_noisy_observations_stay_close():
    fit = fit_http(grid(noise=0.1, seed=3) + grid(busy=2, slowdown=1.2, noise=0.1, seed=4), TEMPLATE, 2, 1)
    o = Observation(1, 2, 64, 16, 1.0, 1.0)
    assert decode_step(fit.profile.step, o) == pytest.approx(decode_step(TRUE, o), rel=0.15)
    assert fit.profile.request_overhead_s == pytest.approx(0.05, abs=0.03)
    assert fit.profile.sharing.slowdown(2) == pytest.approx(1.2, rel=0.1)


def test_too_few_points_or_bad_observations_are_refused():
    with pytest.raises(ValueError):
        fit_http(grid()[:2], TEMPLATE, 2, 1)
    with pytest.raises(ValueError):
        Observation(1, 1, 16, 1, 0.1, 0.1)  # one output token has no TPOT
    with pytest.raises(ValueError):
        Observation(1, 1, 16, 8, 0.0, 0.1)


def test_pinned_pool_fixes_the_count_and_keeps_the_rest():
    cfg = {"model": "m", "autoscale": {"policy": "predictive", "tick_s": 1.0,
                                       "bounds": {"min_instances": 1, "max_instances": 3}}}
    pinned = pinned_pool(cfg, 1)
    assert pinned["autoscale"]["policy"] == "static"
    assert pinned["autoscale"]["static"] == {"instances": 1}
    assert pinned["autoscale"]["bounds"]["max_instances"] == 3 and pinned["autoscale"]["tick_s"] == 1.0
    assert cfg["autoscale"]["policy"] == "predictive"  # the caller's config is untouched
    assert pinned_pool({"model": "m"}, 1)["autoscale"]["bounds"]["max_instances"] == 2


def test_burst_trace_arrives_together():
    t = burst_trace(3, 24, 8)
    assert len(t) == 3 and set(t.arrival_s) == {0.0}
    assert set(t.prompt_tokens) == {24} and set(t.output_tokens) == {8}
