"""Admin overrides of a model's pools (an instance added, removed, drained or taken
back), shared by gateway replicas as a log of operations.

An admin call on any replica appends one :class:`InstanceOp` to the model's log in
the store (compare-and-set, ``replica.py``); every replica applies the operations it
has not applied yet, in order, so each pool ends up with the same instances and the
same drain flags everywhere. Applying is idempotent (adding an instance already
there, or removing one already gone, changes nothing), so a replica that starts
later, or a log republished after the store came back empty, replays from the start.
While the store is away an override is refused (``Frozen``): a change that only one
replica would know of is worse than none. Without the store (one process) an
operation is applied at once, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from llmserve.gateway.pool import Pool
from llmserve.state.replica import Replica

log = logging.getLogger(__name__)

MAX_OPS = 10_000  # admin calls, not requests: a log this long is a script gone wrong


class InstanceOp(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    op: Literal["add", "remove", "drain"]
    version: str
    instance_id: str
    url: str | None = None  # add
    draining: bool = True  # drain: False takes the instance back


class Pools(Protocol):
    name: str
    pools: Mapping[str, Pool]


def check(pools: Mapping[str, Pool], op: InstanceOp) -> None:
    """Refuse an operation that would not apply here: ValueError (a bad add) or
    LookupError (no such instance)."""
    pool = pools[op.version]
    if op.op == "add":
        pool.check_new(op.url or "", op.instance_id)
    elif pool.get(op.instance_id) is None:
        raise LookupError(f"no instance {op.instance_id!r}")


def apply(pools: Mapping[str, Pool], op: InstanceOp) -> None:
    """Apply ``op``; a no-op where it already holds (idempotent replay)."""
    pool = pools.get(op.version)
    if pool is None:
        return
    present = pool.get(op.instance_id) is not None
    if op.op == "add" and not present:
        pool.add_instance(op.url or "", op.instance_id)
    elif op.op == "remove" and present:
        pool.remove_instance(op.instance_id)
    elif op.op == "drain" and present:
        pool.set_draining(op.instance_id, op.draining)


class InstanceOverrides(Protocol):
    async def apply(self, rt: Pools, op: InstanceOp) -> None:
        """Check, then apply everywhere; raises ValueError, LookupError or Frozen."""


class LocalOverrides:
    async def apply(self, rt: Pools, op: InstanceOp) -> None:
        check(rt.pools, op)
        apply(rt.pools, op)


class OverridesDocument:
    """One model's log of operations, and how far this replica has applied it."""

    role = "peer"

    def __init__(self, rt: Pools) -> None:
        self.key = f"overrides:{rt.name}"
        self.pools = rt.pools
        self.ops: list[InstanceOp] = []
        self.applied = 0

    def snapshot(self) -> dict[str, Any]:
        return {"ops": [op.model_dump() for op in self.ops]}

    def adopt(self, value: dict[str, Any]) -> None:
        ops = [InstanceOp.model_validate(o) for o in value.get("ops", [])]  # all or nothing
        if ops[:self.applied] != self.ops[:self.applied]:
            self.applied = 0  # another history (the store came back with another log): replay it
        self.ops = ops

    def checkpoint(self) -> Any:
        return len(self.ops)

    def restore(self, checkpoint: Any) -> None:
        del self.ops[checkpoint:]
        self.applied = min(self.applied, checkpoint)

    def settle(self) -> None:
        for op in self.ops[self.applied:]:
            try:
                apply(self.pools, op)
            except ValueError as e:  # e.g. that URL is in the pool under another id here
                log.warning("override %s not applied in %s: %s", op, self.key, e)
        self.applied = len(self.ops)

    def append(self, op: InstanceOp) -> None:
        if len(self.ops) >= MAX_OPS:
            raise ValueError(f"{self.key} holds {MAX_OPS} operations already")
        self.ops.append(op)


class SharedOverrides:
    def __init__(self, replica: Replica, models: Iterable[Pools]) -> None:
        self.replica = replica
        self._docs = {rt.name: OverridesDocument(rt) for rt in models}
        replica.add(self._docs.values())

    async def apply(self, rt: Pools, op: InstanceOp) -> None:
        doc = self._docs[rt.name]
        await self.replica.refresh(doc)
        check(rt.pools, op)
        await self.replica.change(doc, lambda: doc.append(op))
