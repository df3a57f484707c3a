"""The replica that owns the instances publishes its pools; a follower's pools become
exactly that: instances added, removed, re-pointed and drained to match."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.state.pool_members import PoolMembers
from llmserve.state.replica import Replica
from llmserve.state.store import MemoryStore
from tests.state.test_rollouts import _replica


def _view(rt) -> dict[str, tuple[str, bool]]:
    return {i["instance_id"]: (i["url"], i["draining"]) for i in rt.pools["v1"].snapshot()}


def test_a_follower_mirrors_the_owners_pool():
    async def go():
        store = MemoryStore()
        owner, follower = _replica(), _replica()
        follower.pools["v1"].add_instance("http://127.0.0.1:30", "stale")  # not the owner's
        w, r = Replica(store), Replica(store)
        w.add([PoolMembers("chat", "v1", owner.pools["v1"], "writer")])
        r.add([PoolMembers("chat", "v1", follower.pools["v1"], "reader")])
        await r.start()  # before the owner published: the follower waits, publishes nothing
        assert await store.read("members:chat/v1") is None and "stale" in _view(follower)
        pool = owner.pools["v1"]
        pool.add_instance("http://127.0.0.1:31", "v1-1")
        pool.add_instance("http://127.0.0.1:32", "v1-2")
        pool.set_draining("v1-2")
        await w.start()
        await r.sync()
        assert _view(follower) == _view(owner) and _view(owner)["v1-2"][1] is True
        pool.remove_instance("v1-1")
        pool.remove_instance("v1-2")
        pool.add_instance("http://127.0.0.1:33", "v1-2")  # the id reused for another process
        await w.sync()
        await r.sync()
        assert _view(follower) == _view(owner)
        assert _view(follower)["v1-2"] == ("http://127.0.0.1:33", False)
        await w.stop()
        await r.stop()
    asyncio.run(go())


def test_a_follower_learns_that_the_owners_pool_gave_up_and_that_it_was_retried():
    """The owner's controller gave up starting instances: a follower's requests for the pool
    fail at once with the owner's reason (they waited for a queue timeout before), and
    after a retry they wait for instances again."""
    from llmserve.gateway.balancer import RouteRequest
    from llmserve.gateway.pool import NoHealthyInstance
    from llmserve.priority import PriorityClass

    async def go():
        store = MemoryStore()
        owner, follower = _replica(), _replica()
        w, r = Replica(store), Replica(store)
        w.add([PoolMembers("chat", "v1", owner.pools["v1"], "writer")])
        r.add([PoolMembers("chat", "v1", follower.pools["v1"], "reader")])
        await w.start()
        await r.start()
        owner.pools["v1"].set_failed("pool chat/v1 failed: 3 instances in a row failed: boom")
        await w.sync()
        await r.sync()
        assert follower.pools["v1"].failed == owner.pools["v1"].failed
        with pytest.raises(NoHealthyInstance, match="boom") as refused:  # not queued
            follower.pools["v1"].enqueue(RouteRequest(), PriorityClass.REALTIME)
        assert refused.value.code == "pool_failed"
        owner.pools["v1"].set_failed(None)  # POST /admin/autoscale/retry on the owner
        await w.sync()
        await r.sync()
        assert follower.pools["v1"].failed is None
        assert not follower.pools["v1"].enqueue(RouteRequest(), PriorityClass.REALTIME).done  # waits again
        await w.stop()
        await r.stop()
    asyncio.run(go())
