"""Which version of a served model a request goes to.

Users are sticky by *weighted rendezvous hashing*: each version ``v`` gets the score
``-ln(h(user, v)) / w_v`` with ``h`` a hash into (0, 1), and the lowest score wins.
A version then wins for exactly the share ``w_v / sum(w)`` of users, and when one
version's weight changes (the others keep their proportions), users move only to
or from that version, and exactly as many as its share changed: raising a canary
from 5% to 10% moves 5% of users, all of them onto the canary. This is the
P-MinHash construction, which no stateless weighted hash can beat on movement
across arbitrary weight changes; contiguous ranges would move the users of every
range between the two changed ones.

Hashing alone still moves that changed share of users *mid-conversation*. So with
a stickiness window (``stickiness_window_s`` > 0) the router also remembers where
it sent each user, and the rule is:

- a user seen within the window goes where they went last, whatever the weights
  did since, as long as that version's weight is still above 0 (each request
  restarts the window, so a conversation stays put for as long as it goes on);
- a version at weight 0 (rolled back, or the old one after a promote) keeps
  nobody: its users are hashed again at once;
- a new user, or one idle longer than the window, is hashed with today's weights.

So a canary's share grows by new and returning users, never by moving someone in
the middle of a conversation; the memory is bounded (``max_pinned`` users, the
least recently seen forgotten first).

A header forces a version; anonymous requests are split at random (injectable RNG).
"""

from __future__ import annotations

import enum
import hashlib
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

VERSION_HEADER = "x-llmserve-version"


class RouteReason(enum.Enum):
    HEADER = "header"  # forced by the x-llmserve-version header
    STICKY = "sticky"  # hashed from the user id
    PINNED = "pinned"  # where the user went last, within the stickiness window
    RANDOM = "random"  # anonymous request, weighted random


@dataclass(frozen=True, slots=True)
class RouteDecision:
    version: str
    reason: RouteReason


class UnknownVersion(ValueError):
    """A forced version that this model does not have."""


def _unit_hash(salt: str, user: str, version: str) -> float:
    """A uniform hash into the open interval (0, 1)."""
    digest = hashlib.blake2b(f"{salt}\x00{user}\x00{version}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0**64


def rendezvous_pick(user: str, weights: Mapping[str, float], salt: str = "") -> str:
    """The version a user lands on for these weights (weights > 0 compete)."""
    best, best_score = None, math.inf
    for version, w in weights.items():
        if w <= 0:
            continue
        score = -math.log(_unit_hash(salt, user, version)) / w
        if score < best_score:
            best, best_score = version, score
    if best is None:
        raise ValueError("no version has a positive weight")
    return best


def with_weight(base: Mapping[str, float], version: str, share: float) -> dict[str, float]:
    """Give ``version`` the share ``share`` and the others ``1 - share`` in their base
    proportions; the shape of weight change that moves the fewest users."""
    if not 0.0 <= share <= 1.0:
        raise ValueError("share must be in [0, 1]")
    others = {v: w for v, w in base.items() if v != version and w > 0}
    rest = sum(others.values())
    out = {v: 0.0 for v in base}
    if rest <= 0:
        out[version] = 1.0
        return out
    out.update({v: (1.0 - share) * w / rest for v, w in others.items()})
    out[version] = share
    return out


class VersionRouter:
    """Weighted, sticky version choice for one served model."""

    def __init__(self, weights: Mapping[str, float], *, salt: str = "",
                 rng: random.Random | None = None, stickiness_window_s: float = 0.0,
                 max_pinned: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._salt = salt
        self._rng = rng or random.Random()
        self._versions = tuple(weights)
        self._window = stickiness_window_s
        self._max_pinned = max_pinned
        self._clock = clock
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()  # user -> (version, last seen)
        self.set_weights(weights)

    @property
    def versions(self) -> tuple[str, ...]:
        return self._versions

    @property
    def weights(self) -> dict[str, float]:
        """Normalised weights (summing to 1)."""
        return dict(self._weights)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        unknown = set(weights) - set(self._versions)
        if unknown:
            raise UnknownVersion(f"unknown versions: {sorted(unknown)}")
        if any(w < 0 or math.isnan(w) for w in weights.values()):
            raise ValueError("weights must be non-negative")
        total = sum(weights.values())
        if total <= 0:
            raise ValueError("at least one version needs a positive weight")
        self._weights = {v: weights.get(v, 0.0) / total for v in self._versions}

    def route(self, user: str | None = None, forced: str | None = None) -> RouteDecision:
        """Pick a version: forced by header, else sticky by user, else random."""
        if forced:
            if forced not in self._weights:
                raise UnknownVersion(
                    f"version {forced!r} does not exist; choose one of {list(self._versions)}")
            return RouteDecision(forced, RouteReason.HEADER)
        if user:
            return self._route_user(user) if self._window > 0 else RouteDecision(
                rendezvous_pick(user, self._weights, self._salt), RouteReason.STICKY)
        x, acc = self._rng.random(), 0.0
        last = None
        for version, w in self._weights.items():
            if w <= 0:
                continue
            acc += w
            last = version
            if x < acc:
                return RouteDecision(version, RouteReason.RANDOM)
        return RouteDecision(last, RouteReason.RANDOM)  # x within rounding of 1.0

    def _route_user(self, user: str) -> RouteDecision:
        now = self._clock()
        pin = self._pins.pop(user, None)
        if pin is not None and now - pin[1] <= self._window and self._weights.get(pin[0], 0.0) > 0:
            decision = RouteDecision(pin[0], RouteReason.PINNED)
        else:
            decision = RouteDecision(rendezvous_pick(user, self._weights, self._salt), RouteReason.STICKY)
        self._pins[user] = (decision.version, now)  # to the end: most recently seen
        while len(self._pins) > self._max_pinned:
            self._pins.popitem(last=False)
        return decision

    def pinned(self) -> int:
        """Users remembered (some may be past the window: forgotten lazily)."""
        return len(self._pins)
