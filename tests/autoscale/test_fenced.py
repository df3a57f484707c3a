"""The fenced provider: every start and stop checked against the lease, a start undone
when the lease went while it ran, the token written into what the provider lists."""

from __future__ import annotations

import pytest

from llmserve.autoscale.providers.base import InstanceSpec
from llmserve.autoscale.providers.fenced import FencedProvider, StaleLeader

from .fakes import FakeProvider


class FlippingFence:
    """A lease that holds ``token`` until told otherwise (``lose_during_start``: during the
    inner provider's start, as a leader paused mid-start would find)."""

    def __init__(self, token: int | None) -> None:
        self.token = token
        self.holds = True

    async def valid(self, token: int) -> bool:
        return self.holds and token == self.token


async def test_a_start_carries_the_token_and_the_pool():
    inner = FakeProvider()
    fenced = FencedProvider(inner, FlippingFence(7), "chat/v1")
    handle = await fenced.start(InstanceSpec("v1-t7-1"))
    assert inner.specs[-1].token == 7 and inner.specs[-1].pool == "chat/v1"
    assert await fenced.stop(handle, 1.0) == 0
    assert inner.stops == ["v1-t7-1"] and fenced.refused == 0


@pytest.mark.parametrize("token", [None, 3])
async def test_a_stale_or_missing_token_starts_and_stops_nothing(token):
    inner = FakeProvider()
    fence = FlippingFence(token)
    fenced = FencedProvider(inner, fence, "chat/v1")
    if token is not None:
        handle = await fenced.start(InstanceSpec("a"))
    fence.holds = False
    with pytest.raises(StaleLeader):
        await fenced.start(InstanceSpec("b"))
    if token is not None:
        with pytest.raises(StaleLeader):
            await fenced.stop(handle, 1.0)
        assert inner.engines["a"].exit_code is None and inner.stops == []  # still running
    assert "b" not in inner.engines
    assert fenced.refused == (2 if token is not None else 1)


async def test_a_start_that_outlived_the_lease_is_undone():
    fence = FlippingFence(5)

    class LosesLeaseMidStart(FakeProvider):
        async def start(self, spec):
            handle = await super().start(spec)
            fence.holds = False  # the lease expired while the instance came up
            return handle

    inner = LosesLeaseMidStart()
    fenced = FencedProvider(inner, fence, "chat/v1")
    with pytest.raises(StaleLeader, match="undone"):
        await fenced.start(InstanceSpec("late"))
    assert inner.engines["late"].exit_code is not None  # stopped again: nothing left behind
