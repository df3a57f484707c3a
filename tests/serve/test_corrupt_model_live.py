"""Live: ``llmserve serve`` over a corrupt model (a truncated GGUF) gives up after
``lifecycle.max_start_failures`` instances in a row fail before getting ready, as Ray
Serve's DEPLOY_FAILED: no more starts, one console line naming the engine's error,
the pool's admin row says so, a request gets a 503 naming the reason at once (not
after a queue timeout), and ``POST /admin/autoscale/retry`` starts instances again."""

from __future__ import annotations

import time

import pytest

from tests.autoscale.serve_harness import ServeProcess, serve_config
from tests.helpers import make_tiny_gguf, make_tiny_llama

pytestmark = pytest.mark.slow

LIMIT = 2


def test_a_corrupt_model_fails_the_pool_with_its_reason_until_retried(tmp_path):
    good = make_tiny_gguf(make_tiny_llama(tmp_path, seed=5), tmp_path / "tiny.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    cfg = serve_config(bad, autoscale={"policy": "static", "static": {"instances": 1},
                                       "bounds": {"min_instances": 1, "max_instances": 1}},
                       lifecycle={"restart_backoff_s": 0.1, "max_restart_backoff_s": 0.2,
                                  "max_start_failures": LIMIT})
    serve = ServeProcess(cfg, tmp_path)
    try:
        pool = serve.wait_until(lambda p: p["failed"] is not None, 180, "the pool to give up")
        assert pool["failed"]["failures"] == LIMIT and "exited with code" in pool["failed"]["last_failure"]
        t0 = time.monotonic()
        r = serve.client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and time.monotonic() - t0 < 5, r.text
        message = r.json()["error"]["message"]
        assert "instances in a row failed before getting ready" in message and "exited with code" in message
        assert r.json()["error"]["code"] == "pool_failed"  # not a breaker's no_healthy_instance
        time.sleep(2.0)  # well past the back-off: nothing more is started
        assert len(serve.instances()) == LIMIT
        log = serve.log()
        said = [line for line in log.splitlines() if "instances in a row failed before getting ready" in line]
        assert len(said) == 1 and "/admin/autoscale/retry" in said[0], log[-3000:]

        r = serve.admin("POST", "/autoscale/retry")
        assert r.status_code == 200 and r.json()["failed"] is None, r.text
        assert serve.admin("POST", "/autoscale/retry").status_code == 409
        serve.wait_until(lambda p: p["failed"] is not None, 180, "the pool to give up again")
        assert len(serve.instances()) == 2 * LIMIT
    finally:
        serve.stop()
