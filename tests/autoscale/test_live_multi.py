"""Live: a two-version deployment through ``llmserve serve``, canary and capacity together.

v1 and v2 are two different tiny random models, each its own elastic pool (KPA on
concurrency, so a pool's size follows the share of closed-loop clients its weight
sends it). The canary starts at 5 % with v2's pool empty (``min_instances: 0``):
its first requests queue while an instance starts (scale from zero), and the
analysis does not judge those intervals. A healthy v2 is promoted and v1's pool
drains to its minimum; a v2 answering half its requests with 500s is rolled back
and its pool drains to zero. Requests routed to v1 never fail in either run.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.helpers import make_tiny_llama

from .serve_harness import Load, ServeProcess, serve_config

pytestmark = pytest.mark.slow

CLIENTS = 6


def multi_config(v1_model, v2_model, v2_args=()) -> dict:
    cfg = serve_config(v1_model, autoscale={
        "policy": "kpa", "tick_s": 0.5,
        "kpa": {"target_concurrency": 1.5, "stable_window_s": 3.0, "panic_window_s": 1.0},
        "bounds": {"min_instances": 1, "max_instances": 2, "scale_up_cooldown_s": 1.0,
                   "scale_down_window_s": 3.0}})
    del cfg["model"], cfg["served_model_name"]
    # A pool goes to zero only once nothing arrived for a signal window: keep it short.
    cfg["lifecycle"] = {**cfg["lifecycle"], "signal_window_s": 4.0}
    cfg["models"] = [{
        "name": "chat",
        "versions": [
            {"name": "v1", "model": str(v1_model)},
            {"name": "v2", "model": str(v2_model), "engine_args": list(v2_args),
             "autoscale": {"bounds": {"min_instances": 0}}}],
        "canary": {"version": "v2", "stable": "v1", "start_weight": 0.05, "step_weight": 0.3,
                   "max_weight": 0.65, "interval_s": 4.0, "min_requests": 2, "failure_threshold": 2,
                   # Capacity is the point here, not the statistics: loose error margins
                   # decide on a few dozen requests at 5 %, and no latency or length tests.
                   "max_error_rate_delta": 0.3, "max_refusal_rate_delta": 0.3,
                   "max_ttft_ratio": None, "max_tpot_ratio": None, "max_e2e_ratio": None,
                   "min_output_ratio": None},
    }]
    return cfg


def watch(serve: ServeProcess, until, timeout: float, what: str) -> list[dict]:
    """Sample the canary and both pools until ``until(sample)``; return the samples."""
    samples, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if serve.proc.poll() is not None:
            raise RuntimeError(f"serve exited:\n{serve.log()[-5000:]}")
        try:
            pools, canary = serve.pools(), serve.canary("chat")
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(0.3)
            continue
        s = {"t": time.time(), "state": canary["state"], "weight": canary["weight"],
             "v1": pools["chat/v1"]["provisioned"], "v2": pools["chat/v2"]["provisioned"],
             "v2_ready": pools["chat/v2"]["counts"]["ready"]}
        samples.append(s)
        if until(s):
            return samples
        time.sleep(0.3)
    raise TimeoutError(f"timed out waiting for {what}; last {samples[-3:]}\n{serve.log()[-6000:]}")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("multi")
    return make_tiny_llama(d, seed=1, name="tiny-a"), make_tiny_llama(d, seed=2, name="tiny-b")


def run(tmp_path, config: dict, settled) -> tuple[ServeProcess, Load, list[dict]]:
    serve = ServeProcess(config, tmp_path)
    try:
        serve.wait_ready(1, timeout=120, pool="chat/v1")
        assert serve.pool("chat/v2")["provisioned"] == 0  # scaled to zero until the canary's first request
        with Load(serve.url, {"model": "chat", "prompt": "hello there", "max_tokens": 4}, CLIENTS) as load:
            samples = watch(serve, settled, 240, "the rollout to settle")
            # Keep the clients going while the losing pool drains.
            samples += watch(serve, lambda s: s[LOSER[s["state"]]] == MIN[LOSER[s["state"]]], 90,
                             "the losing pool to drain to its minimum")
        return serve, load, samples
    except BaseException:
        serve.stop()
        raise


LOSER = {"promoted": "v1", "rolled_back": "v2"}
MIN = {"v1": 1, "v2": 0}


def events(serve: ServeProcess) -> list[dict]:
    return serve.admin("GET", "/models/chat/canary/history").json()["events"]


def test_healthy_canary_is_promoted_and_capacity_follows_its_weight(tmp_path, models):
    serve, load, samples = run(tmp_path, multi_config(*models), lambda s: s["state"] == "promoted")
    try:
        hist = events(serve)
        actions = [e["action"] for e in hist]
        assert actions[0] == "start" and hist[0]["weight"] == 0.05
        assert "promote" in actions and actions.count("advance") == 2
        # The cold start was not judged: at least one interval skipped for it.
        assert any(e["action"] == "skip" and "not judged" in e["reason"] for e in hist)
        # v2's pool followed its weight: empty before its traffic, then at least one
        # instance from 5 %, and more when the weight grew (KPA on its own concurrency).
        at_5 = [s["v2"] for s in samples if s["state"] == "progressing" and s["weight"] == 0.05]
        later = [s["v2"] for s in samples if s["weight"] > 0.05]
        assert max(at_5, default=0) >= 1 and max(later) >= max(at_5) and max(later) == 2
        assert load.failed("v1") == [], load.failed("v1")[:5]
        assert len([r for r in load.results if r[1] == "v2"]) > 0
        assert 'llmserve:gateway_cold_start_wait_seconds_count{model="chat",version="v2"}' in serve.metrics()
        # The stable pool shrank as its traffic moved away: from its max under 95 % of
        # the clients down to its min once v2 took them all.
        assert max(s["v1"] for s in samples) == 2
        assert samples[-1]["v1"] == serve.pool("chat/v1")["provisioned"] == 1
    finally:
        serve.stop()


def test_faulty_canary_is_rolled_back_and_its_pool_drained(tmp_path, models):
    config = multi_config(*models, v2_args=["--fault-error-rate", "0.6"])
    serve, load, samples = run(tmp_path, config, lambda s: s["state"] == "rolled_back")
    try:
        actions = [e["action"] for e in events(serve)]
        assert "rollback" in actions and "promote" not in actions
        assert max(s["v2"] for s in samples) >= 1 and samples[-1]["v2"] == 0
        assert load.failed("v1") == [], load.failed("v1")[:5]
        after = [r for r in load.results if r[0] > samples[-1]["t"] - 0.5 and r[1] == "v2"]
        assert after == []  # nobody routed to a rolled-back version
    finally:
        serve.stop()
