"""The replica that owns the instances publishes its pools; a follower's pools become
exactly that: instances added, removed, re-pointed and drained to match."""

from __future__ import annotations

import asyncio

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
