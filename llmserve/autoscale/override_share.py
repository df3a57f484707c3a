"""A pool's manual override shared by the replicas: set on any replica's admin API,
obeyed by whichever one leads, kept across a failover.

The override is one JSON document per pool (``llmserve:override:MODEL/VERSION``): the
instance count (null: cleared), when it ends (unix time; null: until cleared), the
reason and an id. Each replica writes the ones its admin API was given and adopts any
other id it reads, so the leader's :class:`~llmserve.autoscale.overrides.ManualOverride`
is the same as the one an operator set elsewhere, and a new leader starts with it.
Values are plain JSON, never executed.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from llmserve.state.lease import STORE_ERRORS

log = logging.getLogger(__name__)


def override_key(pool: str) -> str:
    return f"llmserve:override:{pool}"


@dataclass(frozen=True, slots=True)
class SharedOverride:
    id: str
    instances: int | None
    until: float | None  # unix time
    reason: str

    @classmethod
    def new(cls, instances: int | None, duration_s: float | None, reason: str, wall: float) -> SharedOverride:
        return cls(secrets.token_hex(6), instances, None if duration_s is None else wall + duration_s, reason)

    def remaining_s(self, wall: float) -> float | None:
        return None if self.until is None else self.until - wall

    def encode(self) -> str:
        return json.dumps({"id": self.id, "instances": self.instances, "until": self.until, "reason": self.reason})

    @classmethod
    def decode(cls, raw: str) -> SharedOverride:
        d: dict[str, Any] = json.loads(raw)
        n, until = d["instances"], d["until"]
        if not (n is None or (isinstance(n, int) and n >= 0)) or not (until is None or isinstance(until, (int, float))):
            raise ValueError(f"bad override document {raw[:200]!r}")
        return cls(str(d["id"]), n, until, str(d["reason"]))


class OverrideShare:
    """One pool's side: what this replica's admin set (to write) and the id last applied."""

    def __init__(self, redis, pool: str) -> None:
        self.redis = redis
        self.key = override_key(pool)
        self.outgoing: SharedOverride | None = None
        self.seen: str | None = None

    def set_here(self, o: SharedOverride) -> None:
        self.outgoing, self.seen = o, o.id

    async def sync(self) -> SharedOverride | None:
        """Write ours, else read the store's: the override to apply now, when it is new to us."""
        try:
            if self.outgoing is not None:
                await self.redis.set(self.key, self.outgoing.encode())
                self.outgoing = None
                return None
            raw = await self.redis.get(self.key)
        except STORE_ERRORS:
            return None  # the next step tries again; ours stays outgoing
        if not raw:
            return None
        try:
            o = SharedOverride.decode(raw)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s: ignoring an unreadable override: %s", self.key, e)
            return None
        if o.id == self.seen:
            return None
        self.seen = o.id
        return o
