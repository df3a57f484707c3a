"""Replicas sharing a rollout through one store (in memory here; Redis in
test_replicas_live.py): an action on one replica is seen and obeyed on another, two
replicas looking at once decide once, and an outage freezes the rollout without
changing what is served, until the store returns."""

from __future__ import annotations

import asyncio
import random

import pytest

from llmserve.gateway.canary import CanaryState, InvalidTransition
from llmserve.gateway.canary_evidence import Outcome
from llmserve.gateway.config import GatewayConfig
from llmserve.gateway.metrics import GatewayMetrics
from llmserve.gateway.runtime import ModelRuntime
from llmserve.state.replica import Frozen, Replica
from llmserve.state.rollouts import SharedRollouts
from llmserve.state.store import MemoryStore, StoreUnavailable

CANARY = {"version": "canary", "stable": "v1", "start_weight": 0.2, "step_weight": 0.2,
          "max_weight": 0.6, "interval_s": 1.0, "min_requests": 3, "latency_slack_s": 0.05,
          "max_error_rate_delta": 0.2, "max_refusal_rate_delta": 0.2}


def _config() -> GatewayConfig:
    return GatewayConfig.model_validate({"models": [{"name": "chat", "canary": CANARY, "versions": [
        {"name": "v1", "weight": 1, "upstreams": ["http://127.0.0.1:9"]},
        {"name": "canary", "weight": 0, "upstreams": ["http://127.0.0.1:10"]}]}]})


def _replica() -> ModelRuntime:
    cfg = _config()
    return ModelRuntime(cfg.models[0], cfg, metrics=GatewayMetrics(lambda: []), observers=[],
                        rng=random.Random(0))


class FlakyStore(MemoryStore):
    """The store, with an outage switch."""

    down = False
    writes_fail = False  # the store went away between a replica's read and its write

    async def read(self, key):
        if self.down:
            raise StoreUnavailable("shared store unreachable: test outage")
        return await super().read(key)

    async def write(self, key, value, expected):
        if self.down or self.writes_fail:
            raise StoreUnavailable("shared store unreachable: test outage")
        return await super().write(key, value, expected)


def _feed(rt: ModelRuntime, now: float, n: int = 40) -> None:
    for i in range(n):
        for v in ("v1", "canary"):
            rt.canary.record(v, now, Outcome(ttft_s=0.01 + i * 1e-4, tpot_s=0.01, e2e_s=0.05,
                                             output_tokens=8))


class Shared(SharedRollouts):
    """A replica's rollouts and its sync, as the gateway holds them."""

    def __init__(self, store, rt):
        super().__init__(Replica(store), [rt])
        self.sync, self.stop = self.replica.sync, self.replica.stop


async def _pair(store):
    a, b = _replica(), _replica()
    ra, rb = Shared(store, a), Shared(store, b)
    a.canary.start(100.0, "started with the gateway")  # auto_start on both replicas
    b.canary.start(100.5, "started with the gateway")
    await ra.replica.start()
    await rb.replica.start()  # the rollout already in the store wins over its own start
    return a, b, ra, rb


def test_an_action_on_one_replica_is_seen_and_obeyed_on_the_other():
    async def go():
        a, b, ra, rb = await _pair(MemoryStore())
        assert b.canary.events() == a.canary.events() and len(a.canary.events()) == 1
        await ra.act(a, "rollback", "not yet")
        await rb.sync()
        assert b.canary.state is CanaryState.ROLLED_BACK
        assert b.router.weights == {"v1": 1.0, "canary": 0.0}  # B routes as A decided
        assert b.router.route(user="anyone").version == "v1"
        await rb.act(b, "start", "again")
        await rb.act(b, "promote", "from B")
        await ra.refresh(a)
        assert a.canary.state is CanaryState.PROMOTED and a.router.weights["canary"] == 1.0
        assert [e["action"] for e in a.canary.events()] == ["start", "rollback", "start", "promote"]
        with pytest.raises(InvalidTransition):
            await ra.act(a, "resume", "not paused")
        with pytest.raises(InvalidTransition):  # promoted on B: the stable now, on A too
            await ra.act(a, "start", "once more")
        await ra.stop()
        await rb.stop()
    asyncio.run(go())


def test_two_replicas_looking_at_once_decide_once():
    async def go():
        a, b, ra, rb = await _pair(MemoryStore())
        _feed(a, 100.6)
        _feed(b, 100.6)
        await ra.tick(a, 102.0)  # A looks first and advances the weight
        await rb.tick(b, 102.0)  # B looked at the same moment: its write loses, it adopts A's
        assert a.canary.weight == b.canary.weight == pytest.approx(0.4)
        actions = [e["action"] for e in b.canary.events()]
        assert actions == ["start", "advance"], actions
        assert b.canary.evidence["canary"].requests == 0  # a new step: B's old evidence is gone
        await ra.stop()
        await rb.stop()
    asyncio.run(go())


def test_an_outage_freezes_the_rollout_and_it_resumes_when_the_store_returns():
    async def go():
        store = FlakyStore()
        a, b, ra, rb = await _pair(store)
        store.down = True
        await ra.sync()
        assert ra.replica.frozen and ra.replica.details()["shared_state"]["rollouts"] == "frozen"
        weights = dict(a.router.weights)
        _feed(a, 100.6)
        await ra.tick(a, 102.0)  # a look is due, but no verdict without the store
        assert a.canary.weight == 0.2 and len(a.canary.events()) == 1
        with pytest.raises(Frozen, match="test outage"):
            await ra.act(a, "promote", "during the outage")
        assert a.canary.state is CanaryState.PROGRESSING and a.router.weights == weights
        assert [m.samples[0].value for m in ra.replica.gauges() if m.name.endswith("shared_state_up")] == [0.0]
        store.down = False
        await ra.sync()
        assert not ra.replica.frozen
        await ra.tick(a, 102.5)  # the look it waited for, on the evidence kept meanwhile
        assert a.canary.weight == pytest.approx(0.4)
        await rb.sync()
        assert b.canary.weight == pytest.approx(0.4)
        await ra.stop()
        await rb.stop()
    asyncio.run(go())


def test_a_store_that_comes_back_empty_gets_the_last_known_rollout():
    async def go():
        store = FlakyStore()
        a, b, ra, rb = await _pair(store)
        await ra.act(a, "pause", "hold on")
        await rb.sync()
        store._docs.clear()  # restarted without persistence
        await rb.sync()  # B republishes what it last adopted
        assert (await store.read("rollout:chat/canary/v1")).value["state"] == "paused"
        await ra.sync()
        assert a.canary.state is CanaryState.PAUSED
        await ra.act(a, "resume", "go on")  # and the versions count afresh
        await rb.sync()
        assert b.canary.state is CanaryState.PROGRESSING
        await ra.stop()
        await rb.stop()
    asyncio.run(go())


def test_a_look_the_store_did_not_take_is_taken_back_with_its_evidence_kept():
    async def go():
        store = FlakyStore()
        a, b, ra, rb = await _pair(store)
        _feed(a, 100.6)
        seen = a.canary.evidence["canary"].requests
        store.writes_fail = True
        await ra.tick(a, 102.0)  # the look advanced the weight locally; the write failed
        assert ra.replica.frozen
        assert a.canary.weight == 0.2 and a.router.weights["canary"] == pytest.approx(0.2)
        assert [e["action"] for e in a.canary.events()] == ["start"]
        assert a.canary.evidence["canary"].requests == seen  # kept for the look after the outage
        store.writes_fail = False
        await ra.sync()
        await ra.tick(a, 102.5)
        assert a.canary.weight == pytest.approx(0.4)
        await ra.stop()
        await rb.stop()
    asyncio.run(go())


def test_a_malformed_rollout_is_never_applied_and_the_next_write_replaces_it():
    async def go():
        store = MemoryStore()
        a, b, ra, rb = await _pair(store)
        key = "rollout:chat/canary/v1"
        good = (await store.read(key)).value
        await store.write(key, {**good, "weight": "all of it", "state": "promoted"}, 1)
        await rb.sync()
        assert b.canary.state is CanaryState.PROGRESSING and b.router.weights["canary"] == pytest.approx(0.2)
        await rb.act(b, "pause", "over the bad one")
        await ra.sync()
        assert a.canary.state is CanaryState.PAUSED
        await ra.stop()
        await rb.stop()
    asyncio.run(go())
