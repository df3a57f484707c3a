"""Sharing one machine's cores over the instances running (``autoscale/core_share.py``)."""

from __future__ import annotations

from llmserve.autoscale.core_share import CoreShare, SharedPool, thread_shares


def test_the_cores_are_split_evenly_with_the_remainder_to_the_first():
    assert thread_shares(2, ["a"]) == {"a": 2}
    assert thread_shares(2, ["b", "a"]) == {"a": 1, "b": 1}
    assert thread_shares(4, ["c", "a", "b"]) == {"a": 2, "b": 1, "c": 1}
    assert thread_shares(2, ["a", "b", "c"]) == {"a": 1, "b": 1, "c": 1}  # never below one
    assert thread_shares(8, []) == {}
    assert sum(thread_shares(16, [str(i) for i in range(5)]).values()) == 16


class _Views:
    def __init__(self, rows):
        self.rows = rows

    def instance_views(self, include_finished: bool = True):
        return self.rows


def _row(iid, state, url="http://127.0.0.1:1"):
    return {"instance_id": iid, "state": state, "url": url}


def test_plan_counts_every_instance_holding_cores_and_tells_only_llmserve_ones_that_answer():
    own = _Views([_row("a", "ready"), _row("b", "starting"), _row("gone", "stopped")])
    foreign = _Views([_row("llama", "ready")])
    share = CoreShare([SharedPool(own, True, "k"), SharedPool(foreign, False)], cores=6)
    plan = share.plan()
    # a, b and the foreign server hold cores: 2 each; only a answers and can be told.
    assert plan == [("a", "http://127.0.0.1:1", 2, "k")]
    share.told["a"] = 2
    assert share.plan() == []  # told already
    own.rows = [_row("a", "ready"), _row("b", "ready")]
    foreign.rows = []
    assert sorted(share.plan()) == [("a", "http://127.0.0.1:1", 3, "k"), ("b", "http://127.0.0.1:1", 3, "k")]


async def test_a_real_instance_takes_its_share_between_steps(tmp_path):
    """A real engine started on 1 thread, told 2, runs on 2 (its engine process says so in /load);
    a second instance coming puts both back on 1."""
    import httpx

    from tests.helpers import make_tiny_llama
    from tests.server.harness import start_engine

    model = make_tiny_llama(tmp_path)
    a = start_engine(model, tmp_path)  # --threads 1
    try:
        views = _Views([_row("a", "ready", a.url)])
        share = CoreShare([SharedPool(views, True)], cores=2)
        await share.start()
        try:
            await share.tick()
            assert share.told == {"a": 2}
            httpx.post(a.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
            assert httpx.get(a.url + "/load").json()["threads"] == 2
            views.rows = [_row("a", "ready", a.url), _row("b", "starting", None)]
            await share.tick()
            httpx.post(a.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
            assert share.told == {"a": 1} and httpx.get(a.url + "/load").json()["threads"] == 1
        finally:
            await share.stop()
        bad = httpx.post(a.url + "/engine/threads", json={"threads": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "threads"
    finally:
        a.stop()


def test_a_pool_sharing_the_cores_runs_at_most_one_instance_per_core():
    from llmserve.autoscale.config import AutoscaleConfig
    from llmserve.autoscale.core_share import cap_to_cores

    auto = AutoscaleConfig.model_validate({"bounds": {"min_instances": 3, "max_instances": 4}})
    capped = cap_to_cores(auto, 2)
    assert (capped.bounds.min_instances, capped.bounds.max_instances) == (2, 2)
    within = cap_to_cores(auto, 8)  # within the cores: bounds as configured, the policy told of the sharing
    assert within.bounds == auto.bounds and within.shared_cores == 8
