"""The pool lease against a real password-protected redis-server: one holder at a time,
a larger token on every takeover, and a stale holder's writes refused by the store."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from llmserve.state.lease import Lease, LeaseConfig
from llmserve.state.redis_conn import connect

FAST = LeaseConfig(ttl_s=0.4, renew_s=0.1)


async def two_leases(url: str, config: LeaseConfig = FAST):
    r = await connect(url)
    return r, Lease(r, "m/v1", config, holder="a"), Lease(r, "m/v1", config, holder="b")


async def test_one_holder_and_a_larger_token_on_takeover(redis_server):
    r, a, b = await two_leases(redis_server.url)
    first = await a.hold()
    assert first.token is not None and first.new
    assert (await b.hold()).token is None  # a holds it
    renewed = await a.hold()
    assert renewed.token == first.token and not renewed.new
    assert await a.valid(first.token)
    await asyncio.sleep(0.6)  # a stops renewing: a pause past its TTL
    taken = await b.hold()
    assert taken.new and taken.token > first.token
    assert not await a.valid(first.token)  # the store refuses a's token from now on
    assert (await a.hold()).token is None and a.token is None  # a learns it lost
    assert await b.fenced_set("llmserve:test:view", "b's")
    assert not await a.fenced_set("llmserve:test:view", "a's")
    assert await r.get("llmserve:test:view") == "b's"
    assert await a.current() == ("b", taken.token)
    await r.aclose()


async def test_release_hands_over_at_once(redis_server):
    r, a, b = await two_leases(redis_server.url, LeaseConfig(ttl_s=10))
    t = (await a.hold()).token
    await a.release()
    got = await b.hold()
    assert got.token == t + 1 and got.new
    await r.aclose()


async def test_a_store_outage_ends_the_lease_after_its_ttl(redis_server):
    r, a, _ = await two_leases(redis_server.url)
    token = (await a.hold()).token
    redis_server.stop()
    held = await a.hold()
    assert held.error is not None and held.token == token  # still ours until the TTL passes
    await asyncio.sleep(0.5)
    held = await a.hold()
    assert held.token is None and not a.leading()
    assert not await a.valid(token)  # no store, no proof
    await r.aclose()


async def test_presence_counts_the_other_replicas(redis_server):
    r, a, b = await two_leases(redis_server.url)
    await a.present()
    assert await a.others_alive() == 0
    await b.present()
    assert await a.others_alive() == 1
    await b.absent()
    assert await a.others_alive() == 0
    await r.aclose()


def test_the_ttl_is_at_most_ten_seconds_and_renewal_shorter():
    assert LeaseConfig().ttl_s <= 10
    with pytest.raises(ValidationError):
        LeaseConfig(ttl_s=30)
    with pytest.raises(ValidationError):
        LeaseConfig(ttl_s=2, renew_s=3)
