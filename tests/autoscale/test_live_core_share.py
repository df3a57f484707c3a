"""``llmserve serve`` at its default threads: the cores follow the instances running.

A lone instance runs on every core; two share them; back to one, it has them all
again (issue 28: a 4-instance maximum used to put every instance on 1 thread of 2
for good). Read from each instance's own ``/load`` (its engine process's threads).
"""

from __future__ import annotations

import time

import httpx
import pytest

from llmserve.autoscale.core_share import thread_shares
from llmserve.engine.threads import available_cores
from tests.helpers import make_tiny_llama

from .serve_harness import ServeProcess, serve_config

pytestmark = pytest.mark.slow


def _threads(serve: ServeProcess) -> dict[str, int]:
    rows = [i for i in serve.instances(finished=False) if i["state"] == "ready"]
    return {i["instance_id"]: httpx.get(i["url"] + "/load", timeout=5).json()["threads"] for i in rows}


def _wait_threads(serve: ServeProcess, n: int, timeout: float = 60) -> dict[str, int]:
    """Until ``n`` instances are ready and each runs on its share of the cores."""
    deadline = time.monotonic() + timeout
    while True:
        got = _threads(serve)
        if len(got) == n and got == thread_shares(available_cores(), got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"threads {got} for {n} instance(s) on {available_cores()} cores\n"
                                 f"{serve.log()[-3000:]}")
        time.sleep(0.5)


@pytest.mark.skipif(available_cores() < 2, reason="two instances need two cores (one each at most)")
def test_instances_get_the_cores_of_the_instances_running(tmp_path):
    cfg = serve_config(make_tiny_llama(tmp_path), autoscale={"policy": "static", "static": {"instances": 1},
                                                            "bounds": {"min_instances": 1, "max_instances": 4}})
    cfg.pop("threads_per_instance")  # the default: shared out
    serve = ServeProcess(cfg, tmp_path)
    try:
        serve.wait_ready(1)
        (only,) = _wait_threads(serve, 1).values()
        assert only == available_cores()
        serve.scale(2)
        serve.wait_ready(2)
        _wait_threads(serve, 2)  # on two cores: one each
        serve.scale(1)
        serve.wait_until(lambda p: p["counts"].get("ready", 0) == 1 and sum(p["counts"].values()) == 1, 60,
                         "back to one instance")
        (back,) = _wait_threads(serve, 1).values()
        assert back == available_cores()
    finally:
        serve.stop()
