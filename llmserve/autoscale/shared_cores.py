"""Instances that share one machine's cores: an added one must be measured to add throughput.

Under ``llmserve serve`` with the local provider, instances divide the machine's
cores (:mod:`llmserve.autoscale.core_share`): one instance alone runs on all of
them, two on half each. A policy that prices every instance at one instance's
capacity then reads a saturated instance as a reason for a second, which only
takes half the cores away from the first: on 2 cores at c = 64 that cost `serve`
a fifth of `engine`'s throughput (issue 28).

So around any demand policy, :class:`CoreBoundPolicy` caps the desired count at
the count that serves the most on these cores (:func:`useful_instances`). What
``n`` instances serve is ``n`` times one instance's capacity at its share of the
threads, from the step models the instances report at the threads they run
(:attr:`PoolSignals.modelled_by_threads`), remembered per thread count. A thread
count never measured is priced linearly in threads from the nearest measured one,
which makes every split worth exactly what it divides: a second instance is
started only once a measurement says the split serves more (ties go to fewer
instances: one API process, one bigger batch, less memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmserve.autoscale.core_share import thread_shares
from llmserve.autoscale.policy import Decision, ScalingPolicy
from llmserve.autoscale.signals import PoolSignals


def capacity_at(threads: int, by_threads: Mapping[int, float]) -> float:
    """One instance's capacity (tokens/s) on ``threads`` threads: measured, else the nearest
    measured thread count's scaled linearly (0 with nothing measured)."""
    if threads in by_threads:
        return by_threads[threads]
    if not by_threads:
        return 0.0
    near = min(by_threads, key=lambda t: (abs(t - threads), t))
    return by_threads[near] * threads / near


def pool_capacity(n: int, cores: int, by_threads: Mapping[int, float]) -> float:
    """What ``n`` instances serve together on ``cores`` shared cores, each on its share."""
    shares = thread_shares(cores, [f"{i:06d}" for i in range(n)])
    return sum(capacity_at(t, by_threads) for t in shares.values())


def useful_instances(cores: int, by_threads: Mapping[int, float]) -> int:
    """The count in 1..cores whose pool capacity is highest (the fewest among equals, within
    1 %: a split must win clearly); 0 when nothing is measured yet (no cap)."""
    if not by_threads:
        return 0
    best, best_cap = 1, pool_capacity(1, cores, by_threads)
    for n in range(2, max(1, cores) + 1):
        cap = pool_capacity(n, cores, by_threads)
        if cap > best_cap * 1.01:
            best, best_cap = n, cap
    return best


@dataclass(frozen=True, slots=True)
class CoreBoundState:
    inner: Any
    by_threads: tuple[tuple[int, float], ...] = ()  # (threads, tokens/s of one instance), latest per count


class CoreBoundPolicy:
    """Any policy, its desired count capped at :func:`useful_instances` for ``cores`` shared cores."""

    def __init__(self, inner: ScalingPolicy, cores: int) -> None:
        self.inner = inner
        self.cores = max(1, cores)

    def initial_state(self) -> CoreBoundState:
        return CoreBoundState(self.inner.initial_state())

    def decide(self, ctx: PoolSignals, state: CoreBoundState) -> Decision:
        d = self.inner.decide(ctx, state.inner)
        seen = dict(state.by_threads)
        seen.update(ctx.modelled_by_threads)  # each report's step model is an average already
        by_threads = tuple(sorted(seen.items()))
        useful = useful_instances(self.cores, seen)
        desired, reason = d.desired, d.reason
        if useful and desired > useful:
            reason = (f"{reason}; capped at {useful}: on {self.cores} shared cores {desired} instances would serve "
                      f"{pool_capacity(desired, self.cores, seen):.0f} tok/s, {useful} serve "
                      f"{pool_capacity(useful, self.cores, seen):.0f}")
            desired = useful
        return Decision(desired, CoreBoundState(d.state, by_threads), reason)
