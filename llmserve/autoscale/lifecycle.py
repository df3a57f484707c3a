"""Instance lifecycle states and the transitions allowed between them, in one place.

Only the controller (or the simulator standing in for it) changes an instance's
state, and it does so through :func:`check_transition`, so an impossible move
(traffic to a cold instance, a stopped instance coming back) is a loud error
rather than a silent bug.
"""

from __future__ import annotations

import enum


class InstanceState(str, enum.Enum):
    """Where an instance is between being asked for and being gone."""

    STARTING = "starting"   # process or actor launched; weights loading
    WARMING = "warming"     # weights loaded; warm-up request running
    READY = "ready"         # takes traffic
    DRAINING = "draining"   # no new traffic; in-flight requests finish
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def provisioned(self) -> bool:
        """Counted as capacity (ready now or on its way) by the scaling policies."""
        return self in (InstanceState.STARTING, InstanceState.WARMING, InstanceState.READY)

    @property
    def billed(self) -> bool:
        """Holding a machine: counted in instance-hours."""
        return self not in (InstanceState.STOPPED, InstanceState.FAILED)


S = InstanceState

# A draining instance may be taken back into service: it is warm, and reviving it
# is the cheapest capacity there is when load returns during a drain.
ALLOWED: dict[InstanceState, frozenset[InstanceState]] = {
    S.STARTING: frozenset({S.WARMING, S.STOPPED, S.FAILED}),
    S.WARMING: frozenset({S.READY, S.STOPPED, S.FAILED}),
    S.READY: frozenset({S.DRAINING, S.FAILED}),
    S.DRAINING: frozenset({S.READY, S.STOPPED, S.FAILED}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset(),
}


class InvalidTransition(RuntimeError):
    """An instance was asked to move between states that do not connect."""


def check_transition(old: InstanceState, new: InstanceState) -> None:
    """Raise :class:`InvalidTransition` unless ``old -> new`` is allowed."""
    if new not in ALLOWED[old]:
        raise InvalidTransition(f"instance cannot go from {old.value} to {new.value}")
