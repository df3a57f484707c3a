"""Admin overrides of instances shared by replicas: an instance added, drained or
removed through one replica is so in every replica's pool, a replica that starts
later replays the log to the same pools, and while the store is away an override is
refused rather than known to one replica only."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.state.instance_overrides import InstanceOp, SharedOverrides
from llmserve.state.replica import Frozen, Replica
from tests.state.test_rollouts import FlakyStore, _replica


def _ids(rt, version="v1") -> dict[str, bool]:  # id -> draining
    return {i["instance_id"]: i["draining"] for i in rt.pools[version].snapshot()}


async def _join(store):
    rt = _replica()
    shared = SharedOverrides(Replica(store), [rt])
    await shared.replica.start()
    return rt, shared


def test_overrides_on_one_replica_hold_in_every_pool():
    async def go():
        store = FlakyStore()
        (a, sa), (b, sb) = await _join(store), await _join(store)
        base = set(_ids(a))
        await sa.apply(a, InstanceOp(op="add", version="v1", instance_id="extra",
                                     url="http://127.0.0.1:11"))
        await sb.replica.sync()
        assert set(_ids(b)) == base | {"extra"}
        await sb.apply(b, InstanceOp(op="drain", version="v1", instance_id="extra"))
        await sa.replica.sync()
        assert _ids(a)["extra"] is True
        with pytest.raises(LookupError):
            await sa.apply(a, InstanceOp(op="remove", version="v1", instance_id="nobody"))
        with pytest.raises(ValueError, match="already in pool"):
            await sb.apply(b, InstanceOp(op="add", version="v1", instance_id="again",
                                         url="http://127.0.0.1:11"))
        first = next(iter(base))
        await sa.apply(a, InstanceOp(op="remove", version="v1", instance_id=first))
        c, sc = await _join(store)  # a replica started later replays the log
        await sb.replica.sync()
        assert _ids(b) == _ids(a) == _ids(c) == {"extra": True}
        store.down = True
        await sa.replica.sync()
        with pytest.raises(Frozen):
            await sa.apply(a, InstanceOp(op="drain", version="v1", instance_id="extra", draining=False))
        assert _ids(a) == {"extra": True}
        for s in (sa, sb, sc):
            await s.replica.stop()
    asyncio.run(go())


def test_a_malformed_log_is_refused_whole():
    async def go():
        store = FlakyStore()
        a, sa = await _join(store)
        before = _ids(a)
        await store.write("overrides:chat", {"ops": [
            {"op": "remove", "version": "v1", "instance_id": next(iter(before))},
            {"op": "exec", "version": "v1", "instance_id": "x"}]}, 1)
        await sa.replica.sync()
        assert _ids(a) == before  # not half applied
        await sa.replica.stop()
    asyncio.run(go())
