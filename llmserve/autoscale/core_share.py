"""One machine's cores shared out over the instances ``llmserve serve`` runs on it.

An instance's torch threads are set when it starts, but a pool's size changes while
it runs: one instance alone should have every core, two should have half each.
Sizing every instance for the most a pool may ever run (cores / max instances)
leaves a lone instance on one core of two; giving each all of them oversubscribes
the cores as soon as a second starts. So the share follows what runs: every tick
the instances that hold cores (starting, warming, ready, draining; foreign ones
too, which cannot be told) are counted, and each llmserve instance whose share
changed is told its new thread count (``POST /engine/threads``), applied between
its steps. :func:`thread_shares` is the rule; :class:`CoreShare` applies it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmserve.lifecycle import InstanceState

log = logging.getLogger(__name__)

# States in which an instance's process holds cores (loading weights, warming, serving, finishing).
HOLDS_CORES = frozenset({InstanceState.STARTING, InstanceState.WARMING, InstanceState.READY,
                         InstanceState.DRAINING})
# States in which it answers HTTP, so can be told its share.
TOLD = frozenset({InstanceState.WARMING, InstanceState.READY, InstanceState.DRAINING})


def thread_shares(cores: int, instance_ids: Iterable[str]) -> dict[str, int]:
    """Threads per instance: the cores split evenly, the remainder one each to the first
    instances by id (every core used, none twice), at least one each."""
    ids = sorted(instance_ids)
    if not ids:
        return {}
    each, extra = divmod(max(1, cores), len(ids))
    return {i: max(1, each + (1 if k < extra else 0)) for k, i in enumerate(ids)}


@dataclass(frozen=True, slots=True)
class SharedPool:
    """A pool whose instances run on this machine: its controller, and whether its
    instances are llmserve engines with no thread count of their own (told their share)."""

    controller: object  # PoolController: .instance_views(include_finished=False)
    told: bool
    api_key: str | None = None


class CoreShare:
    """Tells each instance its share of the cores whenever the running set changes."""

    def __init__(self, pools: Sequence[SharedPool], cores: int, interval_s: float = 1.0) -> None:
        self.pools = list(pools)
        self.cores = cores
        self.interval_s = interval_s
        self.told: dict[str, int] = {}  # instance id -> threads it acknowledged
        self._task: asyncio.Task | None = None
        self._client = None

    async def start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(timeout=2.0)
        self._task = asyncio.create_task(self._run(), name="core-share")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - a missed share is retried next tick
                log.exception("sharing the cores failed")
            await asyncio.sleep(self.interval_s)

    def plan(self) -> list[tuple[str, str, int, str | None]]:
        """``(instance id, url, threads, key)`` for every told instance whose share changed."""
        rows = [(v, p) for p in self.pools for v in p.controller.instance_views(include_finished=False)
                if InstanceState(v["state"]) in HOLDS_CORES]
        shares = thread_shares(self.cores, [v["instance_id"] for v, _ in rows])
        live = {v["instance_id"] for v, _ in rows}
        self.told = {i: n for i, n in self.told.items() if i in live}
        return [(v["instance_id"], v["url"], shares[v["instance_id"]], p.api_key) for v, p in rows
                if p.told and v["url"] and InstanceState(v["state"]) in TOLD
                and self.told.get(v["instance_id"]) != shares[v["instance_id"]]]

    async def tick(self) -> None:
        for iid, url, threads, key in self.plan():
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            try:
                r = await self._client.post(f"{url}/engine/threads", json={"threads": threads}, headers=headers)
            except Exception as e:  # noqa: BLE001 - not up yet, or going: next tick
                log.debug("telling %s its %d threads failed: %s", iid, threads, e)
                continue
            if r.status_code == 200:
                self.told[iid] = threads
                log.info("instance %s: %d of %d cores", iid, threads, self.cores)


def cap_to_cores(autoscale, cores: int):
    """A pool whose instances share this machine's cores runs at most one instance per core:
    beyond that, each added instance only takes threads from the others (and their step
    models, slower, would ask for more instances still); and its policy knows the cores are shared."""
    b = autoscale.bounds
    most = max(1, cores)
    autoscale = autoscale.model_copy(update={"shared_cores": most})  # the policy prices splits (shared_cores.py)
    if b.max_instances <= most:
        return autoscale
    log.warning("max_instances %d capped at %d: instances on this machine share its %d cores",
                b.max_instances, most, cores)
    bounds = b.model_copy(update={"max_instances": most, "min_instances": min(b.min_instances, most)})
    return autoscale.model_copy(update={"bounds": bounds})
