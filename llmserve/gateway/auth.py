"""Who a client is (its API key) and what it may ask for (its privileges).

The gateway decides a request's priority and version; the client only claims
them. The rule, in :func:`grant_priority`:

- no claim: the client's default class (``auth.default_priority`` unless its key
  sets its own), at that class's level (realtime 0, batch 1);
- a claim in a class the client may not use: its default class, silently. Not a
  403: a priority is a scheduling hint that SDKs and benchmark tools send
  generically, and refusing the request would break a client for asking, while
  the downgrade costs it nothing it was entitled to. ``x-llmserve-priority`` on
  the response says what applied; ``gateway_requests_total`` counts by class;
- a claim in an allowed class: that class's level; the integer itself only
  within the key's ``priority_range`` (the engine orders and preempts by the
  integer, so -1000000000 would jump every queue);
- a value that is no priority at all (``"urgent"``, 5,000 digits): 400.

By default a client may use its default class and every less urgent one:
yielding is never a privilege. ``x-llmserve-version`` is honoured only from a key
with ``version_override``. An open gateway (no keys configured) gives every
client ``auth.open_privileges``, by default none beyond the default class.

Only this priority reaches the instances: the proxy rewrites the body's
``priority`` and sends its own ``x-priority``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmserve.api.errors import APIError  # the gateway's error type, without its HTTP responses
from llmserve.api.limits import bearer_token, find_key
from llmserve.priority import PriorityClass, PriorityRange


@dataclass(frozen=True, slots=True)
class Privileges:
    classes: frozenset[PriorityClass]
    default: PriorityClass
    integers: PriorityRange | None = None  # None: an integer claim counts as its class's level
    version_override: bool = False
    key: str | None = None  # the key's name, for its limits and usage (gateway/tenants)
    # The batch runner's lines for a key: charged to its budget and usage, but not to the rate
    # windows and concurrency its interactive traffic lives on (the runner paces lines itself).
    budget_only: bool = False

    @classmethod
    def build(cls, default: PriorityClass, classes: Iterable[PriorityClass] | None = None,
              integers: tuple[int, int] | None = None, version_override: bool = False) -> Privileges:
        """Resolved and checked; raises ValueError. ``classes`` None: ``default`` and
        every less urgent class."""
        allowed = frozenset(PriorityClass(c) for c in classes) if classes is not None else \
            frozenset(c for c in PriorityClass if c >= default)
        if default not in allowed:
            names = sorted(c.name.lower() for c in allowed)
            raise ValueError(f"the default priority {default.name.lower()} is not among the "
                             f"classes it may use {names}")
        return cls(allowed, default, None if integers is None else PriorityRange(*integers),
                   version_override)


def grant_priority(claim: int | None, privileges: Privileges) -> int:
    """The priority a request runs at, from the one it claimed (already parsed)."""
    if claim is None:
        return privileges.default.level
    cls = PriorityClass.of(claim)
    if cls not in privileges.classes:
        return privileges.default.level
    if privileges.integers is not None and claim in privileges.integers:
        return claim
    return cls.level


class ClientAuth:
    """Checks ``Authorization: Bearer <key>`` and says what that key may do."""

    def __init__(self, keys: Mapping[str, Privileges], open_privileges: Privileges) -> None:
        self._keys = [(k.encode(), p) for k, p in keys.items()]
        self._key_bytes = [k for k, _ in self._keys]
        self._open = open_privileges

    def identify(self, authorization: str | None) -> Privileges:
        """The client's privileges; 401 when keys are configured and none matches."""
        if not self._keys:
            return self._open
        found = find_key(bearer_token(authorization), self._key_bytes)
        if found is None:
            raise APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                           code="invalid_api_key")
        return self._keys[found][1]
