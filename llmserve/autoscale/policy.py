"""The scaling-policy contract shared by the live controller and the simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from llmserve.autoscale.signals import PoolSignals


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer for one tick.

    ``desired`` counts instances that should be ready or coming (starting or
    warming); draining instances are not counted. ``state`` is handed back on the
    next tick. ``reason`` is for people: it shows up in the admin API, the
    dashboard and the simulator's event log.
    """

    desired: int
    state: Any
    reason: str

    def __post_init__(self) -> None:
        if self.desired < 0:
            raise ValueError(f"decision: desired must be >= 0, got {self.desired}")


@runtime_checkable
class ScalingPolicy(Protocol):
    """Pure: ``(signals, state) -> Decision``.

    Contract:
    - no I/O and no clock other than ``ctx.now``; the same inputs give the same
      decision, so a policy replays exactly in the simulator and in tests;
    - ``state`` is owned by the caller, who passes back whatever the previous
      decision returned (``initial_state()`` on the first tick); a policy must not
      mutate the state it was given;
    - ``desired`` is compared with ``ctx.provisioned`` (ready + coming) by the
      caller, which starts or drains the difference.
    """

    def initial_state(self) -> Any:
        """The state before the first tick."""
        ...

    def decide(self, ctx: PoolSignals, state: Any) -> Decision:
        """The desired instance count for this tick, the next state and why."""
        ...
