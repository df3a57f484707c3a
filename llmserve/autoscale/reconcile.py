"""Turn a desired instance count into lifecycle actions, purely.

The policy says how many; this module says which. Keeping it pure and separate
lets the live controller and the simulator pick the same instances to start,
revive, cancel or drain.

Scale-up revives draining instances first (they are warm: no cold start), then
starts new ones. Scale-down cancels instances that are still starting (youngest
first: the least sunk cost and the longest wait ahead), then warming ones, then
drains the ready instances with the fewest requests in flight, so draining ends
soon and few requests are still running on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

from llmserve.lifecycle import InstanceState


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """What reconciliation needs to know about one instance."""

    id: Hashable
    state: InstanceState
    in_flight: int = 0
    since: float = 0.0  # when it entered its current state


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """Actions for one tick; all lists hold instance ids."""

    start: int = 0
    revive: list[Hashable] = field(default_factory=list)
    cancel: list[Hashable] = field(default_factory=list)
    drain: list[Hashable] = field(default_factory=list)
    # The capacity class of each start (see capacity_classes.py); empty: the pool's only class.
    start_classes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.start or self.revive or self.cancel or self.drain)


def plan_scaling(desired: int, instances: Sequence[InstanceStatus]) -> ScalePlan:
    """The actions that bring the provisioned count to ``desired``."""
    provisioned = [i for i in instances if i.state.provisioned]
    n = len(provisioned)
    if desired > n:
        need = desired - n
        draining = sorted((i for i in instances if i.state is InstanceState.DRAINING),
                          key=lambda i: (-i.in_flight, i.since))
        revive = [i.id for i in draining[:need]]
        return ScalePlan(start=need - len(revive), revive=revive)
    if desired < n:
        excess = n - desired
        cancel: list[Hashable] = []
        for state in (InstanceState.STARTING, InstanceState.WARMING):
            young_first = sorted((i for i in provisioned if i.state is state), key=lambda i: -i.since)
            cancel.extend(i.id for i in young_first[: excess - len(cancel)])
        ready = sorted((i for i in provisioned if i.state is InstanceState.READY),
                       key=lambda i: (i.in_flight, -i.since))
        drain = [i.id for i in ready[: excess - len(cancel)]]
        return ScalePlan(cancel=cancel, drain=drain)
    return ScalePlan()
