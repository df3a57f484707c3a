"""How many torch threads an engine process gets.

The engine runs in its own process; its API process (HTTP, tokenising, SSE) needs
little CPU per token (a few % of a core at 64 streams). So an instance gets its
whole share of the cores, for every step. An earlier rule ran steps of at most 4
rows on one thread fewer, to leave a core to the API process; measured through HTTP
on 2 cores, paired in one run, it cost a single stream 40 %: 60-65 against
100-122 tok/s (TPOT 15-16 against 8-10 ms; benchmarks/peers/README.md).
(OMP_WAIT_POLICY=PASSIVE was worse everywhere.)
"""

from __future__ import annotations

import os


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # a container's or taskset's share, not the host's
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def engine_threads(cores: int, instances: int = 1) -> int:
    """Torch threads for each of ``instances`` engines sharing ``cores``: its share."""
    return max(1, cores // max(1, instances))
