"""Which instances a pool has, published by the replica whose controller owns them
and mirrored by every other replica.

With ``llmserve serve --replicas N`` the elastic controller runs in one replica
(``state.pools: publish``); it starts and stops the instances and its pool is the
truth. Its replica publishes each pool's instances (id, URL, draining) as a
document; the other replicas (``state.pools: follow``) add, remove and drain their
own pools to match, then probe and balance over them as over any instance. A pool
that the configuration lists (``llmserve gateway --config`` replicas) needs none of
this (``state.pools: own``, the default).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from llmserve.gateway.pool import Pool


class MemberDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    draining: bool


class MembersDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instances: dict[str, MemberDoc]
    failed: str | None = None  # why the controller gave up starting instances (``Pool.set_failed``)


class PoolMembers:
    def __init__(self, model: str, version: str, pool: Pool, role: str) -> None:
        self.key = f"members:{model}/{version}"
        self.pool = pool
        self.role = role  # "writer" (publish) or "reader" (follow)
        self._want: MembersDoc | None = None

    def snapshot(self) -> dict[str, Any]:
        return {"instances": {i["instance_id"]: {"url": i["url"], "draining": i["draining"]}
                              for i in self.pool.snapshot()}, "failed": self.pool.failed}

    def adopt(self, value: dict[str, Any]) -> None:
        self._want = MembersDoc.model_validate(value)

    def checkpoint(self) -> Any:
        return self._want

    def restore(self, checkpoint: Any) -> None:
        self._want = checkpoint

    def settle(self) -> None:
        """Make the pool hold exactly the published instances."""
        if self._want is None or self.role != "reader":
            return
        want = self._want.instances
        for iid in [i.instance_id for i in self.pool.instances() if i.instance_id not in want]:
            self.pool.remove_instance(iid)
        for iid, m in want.items():
            inst = self.pool.get(iid)
            if inst is not None and inst.url != m.url:  # the id now names another process
                self.pool.remove_instance(iid)
                inst = None
            if inst is None:
                self.pool.add_instance(m.url, iid)
            if self.pool.get(iid).accepting == m.draining:
                self.pool.set_draining(iid, m.draining)
        if self.pool.failed != self._want.failed:  # its requests fail at once too, with the reason
            self.pool.set_failed(self._want.failed)
