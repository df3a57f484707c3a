"""How many torch threads an engine process gets, and for which steps.

The engine runs in its own process; its API process (HTTP, tokenising, SSE) needs a
little CPU per token. A step of many rows (a batch of decodes, a prompt chunk) is
matrix work that two OpenMP threads nearly halve, so an instance gets its whole
share of the cores. A step of a few rows (one or a few streams decoding) is ~10 ms
of mostly weight streaming split into hundreds of short parallel regions: there a
second thread gains little, and each time the API process wakes on that core the
step's barrier waits for it. Such steps run on one thread fewer, leaving that core
to the API process. Measured through HTTP on 2 quiet cores (benchmarks/peers/README.md):
one thread 50 / 112 / 140 tok/s at 1 / 16 / 64 streams, two 79 / 202 / 220, two with
one for few-row steps 89 / 190 / 238. (OMP_WAIT_POLICY=PASSIVE was worse everywhere.)
"""

from __future__ import annotations

import os

# Steps of at most this many rows (tokens computed) run on one thread fewer.
FEW_ROWS = 4


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # a container's or taskset's share, not the host's
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def engine_threads(cores: int, instances: int = 1) -> int:
    """Torch threads for each of ``instances`` engines sharing ``cores``: its share."""
    return max(1, cores // max(1, instances))


def step_threads(rows: int, threads: int) -> int:
    """Threads for a step computing ``rows`` tokens on an engine of ``threads``."""
    return max(1, threads - 1) if rows <= FEW_ROWS else threads
