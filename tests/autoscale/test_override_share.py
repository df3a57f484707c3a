"""A manual override set on one replica reaches the others once, through a real Redis;
a document that is not an override is ignored, never applied."""

from __future__ import annotations

from llmserve.autoscale.override_share import OverrideShare, SharedOverride, override_key
from llmserve.state.redis_conn import connect


async def test_an_override_set_on_one_replica_is_adopted_once_by_another(redis_server):
    r = await connect(redis_server.url)
    here, there = OverrideShare(r, "chat/v1"), OverrideShare(r, "chat/v1")
    o = SharedOverride.new(3, 60.0, "ops: load test", wall=1000.0)
    here.set_here(o)
    assert await here.sync() is None  # written, not re-applied here
    got = await there.sync()
    assert got == o and got.remaining_s(1010.0) == 50.0
    assert await there.sync() is None  # once
    assert await here.sync() is None  # its own, already applied
    await r.set(override_key("chat/v1"), '{"id": "x", "instances": -2, "until": null, "reason": "r"}')
    assert await there.sync() is None
    await r.set(override_key("chat/v1"), "not json")
    assert await there.sync() is None
    await r.aclose()
