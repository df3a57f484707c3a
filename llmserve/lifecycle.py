"""Instance lifecycle states and the transitions allowed between them, in one place.

One vocabulary for every layer: the engine server reports its state with these
words on ``/ready`` and ``/load``, the controller's probe reads them back with
:meth:`InstanceState.from_wire`, the controller and the simulator move their
instances through :data:`ALLOWED`, and the gateway's pool keeps each upstream's
place in it. No torch here: the gateway and the controller import this module.

Only the controller (or the simulator standing in for it) changes a managed
instance's state, and it does so through :func:`check_transition`, so an
impossible move (traffic to a cold instance, a stopped instance coming back) is a
loud error rather than a silent bug.
"""

from __future__ import annotations

import enum


class InstanceState(str, enum.Enum):
    """Where an instance is between being asked for and being gone."""

    STARTING = "starting"   # process or actor launched; weights loading
    WARMING = "warming"     # weights loaded; warm-up request running
    READY = "ready"         # takes traffic
    DRAINING = "draining"   # no new traffic; in-flight requests finish
    STOPPING = "stopping"   # out of the pool; told to stop, not exited yet
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def provisioned(self) -> bool:
        """Counted as capacity (ready now or on its way) by the scaling policies."""
        return self in (InstanceState.STARTING, InstanceState.WARMING, InstanceState.READY)

    @property
    def billed(self) -> bool:
        """Holding a machine: counted in instance-hours (a stopping one still is)."""
        return self not in (InstanceState.STOPPED, InstanceState.FAILED)

    @property
    def terminal(self) -> bool:
        return not ALLOWED[self]

    @classmethod
    def from_wire(cls, word: object) -> InstanceState | None:
        """The state an engine's ``state`` word names; None for no word or one we do
        not know (a foreign server's), which callers treat as "it did not say"."""
        if not isinstance(word, str):
            return None
        word = word.strip().lower()
        try:
            return cls(word)
        except ValueError:
            return _OLD_WORDS.get(word)


S = InstanceState

# Engines before the shared enum said "loading" for what is now "starting"; an
# old instance still running during an upgrade must still be understood.
_OLD_WORDS = {"loading": S.STARTING}

# A draining instance may be taken back into service: it is warm, and reviving it
# is the cheapest capacity there is when load returns during a drain. Every stop
# (a cancelled start, a finished drain, shutdown) goes through STOPPING: the
# instance is out of the pool and no longer capacity, but still billed until its
# process has exited.
ALLOWED: dict[InstanceState, frozenset[InstanceState]] = {
    S.STARTING: frozenset({S.WARMING, S.STOPPING, S.FAILED}),
    S.WARMING: frozenset({S.READY, S.STOPPING, S.FAILED}),
    S.READY: frozenset({S.DRAINING, S.FAILED}),
    S.DRAINING: frozenset({S.READY, S.STOPPING, S.FAILED}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset(),
}


class LifecycleError(RuntimeError):
    """An instance was asked to move between states that do not connect."""


def check_transition(old: InstanceState, new: InstanceState) -> None:
    """Raise :class:`LifecycleError` unless ``old -> new`` is allowed."""
    if new not in ALLOWED[old]:
        raise LifecycleError(f"instance cannot go from {old.value} to {new.value}")
