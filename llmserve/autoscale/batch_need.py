"""Batch work in a pool's size: idle capacity first, instances only for what a window needs.

Pure, and shared by every policy (and so by the live controller and the simulator).
A policy sizes the pool for its realtime demand as it always has; batch-class
lines then fill what that pool leaves idle (the batch class yields in every
admission queue and on every engine). Only when the realtime demand plus the
rate the batches' completion windows require (``PoolSignals.batch_need_tokens_per_s``,
from the batch pace rule: remaining lines / time left) would not fit the pool at
the policy's target utilisation does the pool grow, and then by just enough for
that need: the backlog itself, its arrivals and its queue, is never demand.
"""

from __future__ import annotations

import math

from llmserve.autoscale.signals import PoolSignals


def with_batch_need(desired: int, realtime_tokens_per_s: float, need_tokens_per_s: float,
                    capacity_tokens_per_s: float, target_utilisation: float) -> int:
    """``desired`` (sized for ``realtime_tokens_per_s``) raised only as far as the batch
    need requires: to the instances that carry realtime plus need at ``target_utilisation``.

    ``capacity_tokens_per_s`` is one instance's saturation throughput; 0 (unknown)
    adds nothing: an unmeasured pool is not grown for a batch."""
    if need_tokens_per_s <= 0 or capacity_tokens_per_s <= 0:
        return desired
    fits = math.ceil((realtime_tokens_per_s + need_tokens_per_s) / (capacity_tokens_per_s * target_utilisation)
                     - 1e-9)
    return max(desired, fits)


def observed_capacity(ctx: PoolSignals) -> float:
    """One instance's saturation throughput as the signals tell it (for the policies that
    keep no estimate): the instances' step model, else throughput over batch fill."""
    if ctx.modelled_capacity > 0:
        return ctx.modelled_capacity
    if ctx.batch_fill > 0 and ctx.throughput_per_instance > 0:
        return ctx.throughput_per_instance / ctx.batch_fill
    return 0.0
