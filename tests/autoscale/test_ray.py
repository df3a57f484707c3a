"""Instances as Ray actors: ``llmserve serve`` with the Ray provider on a local Ray runtime.

Scales the pool to two Ray-hosted instances (each an actor running an engine on
its node, here the one local node on loopback, the default for a runtime serve
starts), routes real requests through both (the gateway sends the pool's
generated key; a request without it is refused), scales back to one and checks
that the drained instance's engine exited 0.
Skipped only where ``ray`` cannot be imported.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.helpers import make_tiny_llama

from .serve_harness import ServeProcess, serve_config, settled_at

pytestmark = pytest.mark.slow


def test_ray_provider_scales_to_two_actors_and_back(tmp_path):
    pytest.importorskip("ray")
    model = make_tiny_llama(tmp_path)
    cfg = serve_config(model, provider={"kind": "ray", "ray_num_cpus": 1.0, "ray_local_num_cpus": 2},
                       autoscale={"policy": "static", "static": {"instances": 1},
                                  "bounds": {"min_instances": 1, "max_instances": 2}})
    serve = ServeProcess(cfg, tmp_path, env={"RAY_USAGE_STATS_ENABLED": "0"})
    try:
        pool = serve.wait_ready(1, timeout=180)
        assert pool["provider"] == "ray"
        serve.scale(2, "two ray actors")
        serve.wait_ready(2, timeout=180)
        live = serve.instances(finished=False)
        assert [i["state"] for i in live] == ["ready", "ready"]
        assert all(i["url"].startswith("http://127.0.0.1:") for i in live)
        keyless = httpx.post(f"{live[0]['url']}/v1/completions", json={"model": "tiny", "prompt": "x"}, timeout=30)
        assert keyless.status_code == 401, keyless.text
        started = {e["instance_id"]: e["details"] for e in serve.events() if e["kind"] == "started"}
        assert all(d.get("node_id") and d.get("host_pid") != serve.proc.pid for d in started.values()), started

        def ask(k: int) -> int:
            body = {"model": "tiny", "prompt": f"request {k}: once upon a time", "max_tokens": 24,
                    "ignore_eos": True}
            return httpx.post(f"{serve.url}/v1/completions", json=body, timeout=60).status_code

        with ThreadPoolExecutor(8) as ex:  # 8 at once over 2 x 4 seats: both actors serve
            assert list(ex.map(ask, range(16))) == [200] * 16
        served = {i["instance_id"]: i["served"] for i in serve.instances(finished=False)}
        assert sum(served.values()) == 16 and min(served.values()) >= 1, served

        serve.scale(1, "back to one")
        serve.wait_until(settled_at(1), 60, "back to one")
        events = serve.events()
        stopped = [e for e in events if e["new"] == "stopped"]
        assert len(stopped) == 1 and stopped[0]["details"]["exit_code"] == 0, stopped
        gone = started[stopped[0]["instance_id"]]["pid"]
        assert ask(99) == 200
    finally:
        code = serve.stop()
    assert code in (0, -signal.SIGTERM), serve.log()[-3000:]
    with pytest.raises(ProcessLookupError):
        os.kill(gone, 0)  # the drained actor's engine is gone
