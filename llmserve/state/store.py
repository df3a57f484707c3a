"""What gateway replicas agree on: small JSON documents, each with a version number.

A document (a canary's rollout, a model's overrides) is read whole and written with
compare-and-set: ``write(key, value, expected)`` succeeds only when the stored
version is still ``expected`` (0: the key does not exist yet), so two replicas that
decide at once cannot both win; the loser reads again. Redis does the check and the
write in one Lua script, atomically. Values are JSON objects and nothing else:
nothing read back is executed or unpickled, and a value that is not a JSON object
is refused as :class:`CorruptValue`.

:class:`MemoryStore` is the single-process default and the tests' twin of
:class:`RedisStore`; both raise :class:`StoreUnavailable` only for an outage, which
the replicas answer by degrading (``llmserve/state/rollouts.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from redis import exceptions as redis_errors

# KEYS[1] the document, ARGV[1] the version the writer read, ARGV[2] the new JSON.
# Returns the new version, or -1 when another writer got there first.
_CAS = """
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if v ~= tonumber(ARGV[1]) then return -1 end
redis.call('HSET', KEYS[1], 'v', v + 1, 'json', ARGV[2])
return v + 1
"""


class StoreUnavailable(RuntimeError):
    """The store did not answer (down, unreachable, timed out)."""


class CorruptValue(ValueError):
    """A stored value that is not a JSON object: refused, never interpreted."""


@dataclass(frozen=True, slots=True)
class Versioned:
    version: int  # 1 for the first write; a key never written reads as None
    value: dict[str, Any]


class SharedState(Protocol):
    """Versioned JSON documents under string keys.

    ``read`` returns None for a key never written; ``write`` returns the new
    :class:`Versioned`, or None when the stored version is no longer ``expected``."""

    async def read(self, key: str) -> Versioned | None: ...

    async def write(self, key: str, value: dict[str, Any], expected: int) -> Versioned | None: ...

    async def close(self) -> None: ...


def _decode(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise CorruptValue(f"stored value is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise CorruptValue(f"stored value is a JSON {type(value).__name__}, not an object")
    return value


class MemoryStore:
    """One process's documents. Values round-trip through JSON, as in Redis, so a
    reader never shares (or mutates) the writer's objects."""

    def __init__(self) -> None:
        self._docs: dict[str, tuple[int, str]] = {}

    async def read(self, key: str) -> Versioned | None:
        doc = self._docs.get(key)
        return None if doc is None else Versioned(doc[0], _decode(doc[1]))

    async def write(self, key: str, value: dict[str, Any], expected: int) -> Versioned | None:
        current = self._docs.get(key, (0, ""))[0]
        if current != expected:
            return None
        raw = json.dumps(value)
        self._docs[key] = (current + 1, raw)
        return Versioned(current + 1, _decode(raw))

    async def close(self) -> None:
        return None


OUTAGE = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


class RedisStore:
    """Documents as Redis hashes ``{v, json}`` under ``prefix + key``, on a client
    from :func:`llmserve.state.redis_conn.connect` (authenticated)."""

    def __init__(self, client: Any, prefix: str = "llmserve:") -> None:
        self._r = client
        self._prefix = prefix
        self._cas = client.register_script(_CAS)

    async def read(self, key: str) -> Versioned | None:
        try:
            v, raw = await self._r.hmget(self._prefix + key, "v", "json")
        except OUTAGE as e:
            raise StoreUnavailable(f"shared store unreachable: {e}") from None
        if v is None or raw is None:
            return None
        return Versioned(int(v), _decode(raw))

    async def write(self, key: str, value: dict[str, Any], expected: int) -> Versioned | None:
        raw = json.dumps(value)
        try:
            got = int(await self._cas(keys=[self._prefix + key], args=[expected, raw]))
        except OUTAGE as e:
            raise StoreUnavailable(f"shared store unreachable: {e}") from None
        return None if got < 0 else Versioned(got, _decode(raw))

    async def close(self) -> None:
        await self._r.aclose()
