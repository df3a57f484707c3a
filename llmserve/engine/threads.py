"""How many torch threads an engine process gets.

The engine runs in its own process; its API process (HTTP, tokenising, SSE) needs
about a tenth of a core per hundred streamed tokens a second. On a machine of four
or more cores per instance a whole core is left to it: a quarter or less of the
compute, and no OpenMP thread ever waits on a descheduled peer. On one or two
cores per instance that would halve the compute; measured on 2 cores the engine
is faster with both (benchmarks/peers/README.md).
"""

from __future__ import annotations

import os


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # a container's or taskset's share, not the host's
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def engine_threads(cores: int, instances: int = 1) -> int:
    """Torch threads for each of ``instances`` engines sharing ``cores``."""
    per = max(1, cores // max(1, instances))
    return per - 1 if per >= 4 else per
