"""How many torch threads an engine process gets.

The engine runs in its own process; its API process (HTTP, tokenising, SSE), the
clients on the same box and the OS need CPU too. An OpenMP step waits for its
slowest thread, so a thread that shares its core with them stalls the whole step:
on 2 shared cores, two torch threads gave 7 to 124 tok/s for one stream from run
to run and a 5.8x realtime TTFT p90 under batch prompts; one thread gave a steady
~50 tok/s and 1.7x (benchmarks/peers/README.md). So one core is left to the rest
wherever there are two or more per instance.
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
    return max(1, per - 1)
