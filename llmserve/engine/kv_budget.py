"""How much memory an engine's KV pool may take by default.

A fixed budget (it was 2 GiB) ignores how many instances share the machine: the pool is
committed page by page as the block LRU walks it, so four instances on a small box would
each grow toward 2 GiB and the last ones would be killed long after they started. The
default is a share of the memory free at start, split over the instances that may run at
once (the serve command knows its most), capped; an explicit size always wins.
"""

from __future__ import annotations

from pathlib import Path

KV_SHARE = 0.5  # of the memory available at start: the rest is weights, runtimes, the OS
KV_CAP_BYTES = 2 << 30  # per instance: more than a small model's batch ever holds


def default_kv_bytes(available: int | None, instances: int = 1, share: float = KV_SHARE,
                     cap: int = KV_CAP_BYTES) -> int:
    """Bytes for one instance's pool: ``share`` of ``available`` over ``instances``, at most
    ``cap``; ``cap`` where the available memory is unknown."""
    if available is None:
        return cap
    return max(0, min(cap, int(available * share) // max(1, instances)))


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable in bytes (what can be allocated without swapping), None where unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
