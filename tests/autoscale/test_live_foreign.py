"""Live: a pool of foreign engines, started from a command template by ``llmserve serve``.

The stand-in (``tests/autoscale/standin_server.py``) is what vLLM looks like from
outside: ``/health`` and Prometheus ``/metrics`` in vLLM's names, no ``/ready``
or ``/load``. The controller launches it through the local provider, probes its
``/health``, reads its load from ``/metrics``, scales it up on request and drains
it back; the gateway serves the model's name while the server knows its own.
No torch is loaded, so this one is cheap.
"""

from __future__ import annotations


import pytest

from .serve_harness import ServeProcess, settled_at, standin_config


@pytest.fixture
def serve(tmp_path):
    s = ServeProcess(standin_config(max_instances=2, startup_delay_s=0.5), tmp_path)
    try:
        yield s
    finally:
        s.stop()


def test_foreign_engines_are_launched_probed_scaled_and_drained(serve):
    serve.wait_ready(1, timeout=60)
    r = serve.client.post("/v1/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == " ok ok"  # the gateway sent the server's own model name
    serve.scale(2, "test: up")
    serve.wait_until(lambda p: p["counts"]["ready"] == 2, 60, "two foreign instances")
    for _ in range(6):
        assert serve.client.post("/v1/completions", json={"model": "chat", "prompt": "x"}).status_code == 200
    serve.wait_until(lambda p: all(i["load"] is not None for i in serve.instances(finished=False)), 30,
                     "load read from /metrics")
    serve.scale(1, "test: down")
    serve.wait_until(settled_at(1), 60, "drained back to one")
    stopped = [i for i in serve.instances() if i["state"] == "stopped"]
    # "drained": the gateway had nothing in flight and the server's /metrics said nothing
    # ran or waited (the controller read them). uvicorn re-raises SIGTERM once it has
    # shut down gracefully, hence -15 rather than 0.
    assert len(stopped) == 1 and stopped[0]["exit_code"] in (0, -15) and "drained" in stopped[0]["reason"]
