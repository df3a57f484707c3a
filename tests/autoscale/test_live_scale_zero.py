"""Live: a pool with ``min_instances: 0`` serves its first request after an idle period.

The request queues at the gateway (within the admission deadline) while the
controller, seeing it as demand, starts an instance; it succeeds once that
instance is ready. Its wait is bounded by the instance's own cold start plus a
decision step (a tick and a probe round, with slack for a shared CPU), and it is
counted in the gateway's cold-start wait histogram. Idle again, the pool goes
back to zero, and the next first request is served the same way.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.helpers import make_tiny_llama

from .serve_harness import ServeProcess, serve_config, settled_at

pytestmark = pytest.mark.slow

TICK_S, PROBE_S = 0.5, 0.2
STEP_SLACK_S = 5.0  # a tick, a probe round, the request itself, on shared cores


def first_request(serve: ServeProcess) -> float:
    t0 = time.monotonic()
    r = serve.client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def test_first_request_after_idle_waits_for_a_cold_start_and_succeeds(tmp_path):
    model = make_tiny_llama(tmp_path, seed=3, name="tiny-zero")
    cfg = serve_config(model, cold_start_delay_s=1.0, autoscale={
        "policy": "kpa", "tick_s": TICK_S, "kpa": {"target_concurrency": 1.0, "stable_window_s": 2.0, "panic_window_s": 1.0},
        "bounds": {"min_instances": 0, "max_instances": 1, "scale_down_window_s": 1.0}},
        lifecycle={"probe_interval_s": PROBE_S, "signal_window_s": 2.0, "stop_grace_s": 20.0,
                   "drain_timeout_s": 30.0})
    serve = ServeProcess(cfg, tmp_path)
    try:
        for round_ in range(2):
            serve.wait_until(settled_at(0), 60,
                             "the pool at zero")
            waited = first_request(serve)
            started = [i for i in serve.instances() if i["cold_start_s"] is not None]
            cold = max(i["cold_start_s"] for i in started)  # the instance that served it
            assert len(started) == round_ + 1
            assert waited <= cold + TICK_S + PROBE_S + STEP_SLACK_S, (waited, cold)
        m = re.search(r'llmserve:gateway_cold_start_wait_seconds_count\{model="tiny",version="v1"\} (\S+)',
                      serve.metrics())
        assert m and float(m.group(1)) == 2.0
        ups = [d for d in serve.decisions() if d["provisioned"] == 0 and d["desired"] >= 1]
        assert len(ups) == 2  # once per first request, each from zero
    finally:
        serve.stop()
