"""What a gateway shares with its replicas, or keeps alone: one object for the runtime.

Without ``state.redis_url`` this is :meth:`GatewayState.local`: rollouts and admin
overrides live in the process, exactly as a single gateway has always kept them.
With it, :func:`open_state` connects (authenticated, ``redis_conn.py``) and both
become documents of one :class:`~llmserve.state.replica.Replica`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any

from llmserve.state.instance_overrides import InstanceOverrides, LocalOverrides, SharedOverrides
from llmserve.state.pool_members import PoolMembers
from llmserve.state.replica import Replica
from llmserve.state.rollouts import LocalRollouts, Rollouts, SharedRollouts
from llmserve.state.outcomes import OutcomeShare
from llmserve.state.signals import Relay, SignalForwarder, SignalIntake


class GatewayState:
    def __init__(self, rollouts: Rollouts, overrides: InstanceOverrides,
                 replica: Replica | None = None, relays: list[Relay] | None = None) -> None:
        self.rollouts = rollouts
        self.overrides = overrides
        self.replica = replica
        self.relays = relays or []  # canary outcomes to every replica; request signals to the controller's

    @classmethod
    def local(cls) -> GatewayState:
        return cls(LocalRollouts(), LocalOverrides())

    async def start(self) -> None:
        if self.replica is not None:
            await self.replica.start()
        for r in self.relays:
            await r.start()

    async def stop(self) -> None:
        for r in self.relays:
            await r.stop()
        if self.replica is not None:
            await self.replica.stop()

    def details(self) -> dict[str, Any]:
        """For ``/ready``: nothing in one process; the store's state with replicas."""
        return {} if self.replica is None else self.replica.details()

    def gauges(self) -> list:
        return [] if self.replica is None else self.replica.gauges()


async def open_state(redis_url: str | None, password_file: Path | None, models: Collection[Any], *,
                     pools: str = "own", observers: list | None = None,
                     sync_interval_s: float = 0.5) -> GatewayState:
    """The local state without a URL; else the shared one on an authenticated client
    (a StoreError, one line, when the store refuses us or cannot be reached).
    ``pools``: ``state.pools`` (``pool_members.py``); ``observers``: the gateway's request
    observers, which a follower forwards to and the publisher replays into (``signals.py``)."""
    if redis_url is None:
        return GatewayState.local()
    from llmserve.state.redis_conn import connect
    from llmserve.state.store import RedisStore

    client = await connect(redis_url, password_file)
    replica = Replica(RedisStore(client), sync_interval_s=sync_interval_s)
    analyses = {rt.name: rt.canary for rt in models if rt.canary is not None}
    share = OutcomeShare(client, analyses)
    for rt in models:
        if rt.canary is not None:  # new requests' outcomes go to every replica's evidence too
            rt.sinks = dataclasses.replace(rt.sinks, outcomes=share.sink(rt.name))
    relays = [Relay(share, sync_interval_s)]
    if pools != "own":
        role = "writer" if pools == "publish" else "reader"
        replica.add(PoolMembers(rt.name, v, pool, role) for rt in models for v, pool in rt.pools.items())
        observed = observers if observers is not None else []
        side: SignalForwarder | SignalIntake
        if pools == "follow":
            side = SignalForwarder(client)
            observed.append(side)
        else:
            side = SignalIntake(client, lambda: observed)
        relays.append(Relay(side, sync_interval_s))
    return GatewayState(SharedRollouts(replica, models), SharedOverrides(replica, models), replica, relays)


def check_store(redis_url: str | None, password_file: Path | None = None) -> None:
    """Before a replica starts serving: exit with one line if the store refuses us."""
    if redis_url is None:
        return
    from llmserve.state.redis_conn import StoreError, connect

    async def once() -> None:
        await (await connect(redis_url, password_file)).aclose()

    try:
        asyncio.run(once())
    except StoreError as e:
        raise SystemExit(f"llmserve: error: {e}") from None
