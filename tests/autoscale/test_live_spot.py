"""Live: a pool with a spot instance under steady load; a reclaim with notice loses nothing.

Real engine processes (a tiny random model) behind ``llmserve serve``: a static
pool of two, the base (one) on on-demand and the other on spot. Under a steady
stream of requests the spot instance is reclaimed through the admin API with a
notice of a few seconds (the local provider kills it at the deadline). Every
request must succeed, the replacement must be ready before the deadline (it is
started at the notice: the tick is a minute, longer than the notice), the old
instance must have drained and exited on its own rather than being killed, and
the class must show in the admin API and the metrics. Reclaims without notice
(SIGKILL), and notices shorter than the streams in flight, are
test_live_spot_kill.py's.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import make_tiny_llama

from .serve_harness import Load, ServeProcess, serve_config

pytestmark = pytest.mark.slow

NOTICE_S = 20.0


def by_id(serve: ServeProcess) -> dict[str, dict]:
    return {i["instance_id"]: i for i in serve.instances()}


def metric(text: str, name: str, cls: str) -> float:
    want = {"model": "tiny", "version": "v1", "capacity_class": cls}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == want:
                return s.value
    raise AssertionError(f"{name} for {cls} not exported")


def test_a_reclaim_with_notice_loses_no_request_and_the_replacement_is_ready_first(tmp_path):
    model = make_tiny_llama(tmp_path, seed=5, name="tiny-spot")
    cfg = serve_config(model, autoscale={
        "policy": "static", "tick_s": 60.0, "static": {"instances": 2},
        "bounds": {"min_instances": 1, "max_instances": 3},
        "capacity": {"spot": {"max_instances": 2, "price_per_hour": 0.35}}})
    serve = ServeProcess(cfg, tmp_path)
    try:
        serve.wait_ready(2, timeout=180)
        classes = {i["instance_id"]: i["capacity_class"] for i in serve.instances(finished=False)}
        assert sorted(classes.values()) == ["on_demand", "spot"]
        spot = next(i for i, c in classes.items() if c == "spot")
        body = {"model": "tiny", "prompt": "hello there", "max_tokens": 16, "ignore_eos": True, "temperature": 0}
        with Load(serve.url, body, clients=2, timeout_s=120) as load:
            time.sleep(2.0)
            r = serve.admin("POST", f"/autoscale/instances/{spot}/reclaim", params={"notice_s": NOTICE_S})
            assert r.status_code == 200, r.text
            deadline = r.json()["reclaim_at"]
            serve.wait_until(lambda p: p["counts"]["ready"] == 2 and spot not in
                             {i for i, v in by_id(serve).items() if v["state"] in ("ready", "draining")},
                             120, "the replacement ready and the reclaimed instance gone")
            time.sleep(2.0)  # the replacement takes traffic too
        assert len(load.results) > 20 and load.failed() == [], load.failed()[:5]

        rows = by_id(serve)
        new = next(i for i, v in rows.items() if v["replaces"] == spot)
        assert rows[new]["capacity_class"] == "spot" and rows[new]["state"] == "ready"
        assert rows[spot]["state"] == "stopped" and rows[spot]["exit_code"] == 0  # drained, not killed
        assert rows[spot]["reclaim_at"] == pytest.approx(deadline)
        events = serve.events()
        joined = next(e["time"] for e in events if e["kind"] == "pool_add" and e["instance_id"] == new)
        assert joined < deadline
        text = serve.metrics()
        assert metric(text, "llmserve:autoscale_reclaims_total", "spot") == 1
        assert metric(text, "llmserve:autoscale_class_instances", "spot") == 1
        assert metric(text, "llmserve:autoscale_instance_cost_dollars_total", "spot") > 0
        assert serve.pool()["class_counts"] == {"on_demand": 1, "spot": 1}

        r = serve.admin("POST", "/autoscale/instances/nope/reclaim", params={"notice_s": 1})
        assert r.status_code == 404
    finally:
        serve.stop()
