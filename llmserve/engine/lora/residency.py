"""Which adapter sits in which slot for a step: a pure decision over the slot table.

Adapters a step needs that are resident stay where they are (no copy); each missing one
takes the lowest free slot (the step reads slots ``0..hi``, so low slots keep it short),
else the slot of the least recently used adapter the step does not need. The scheduler
never plans more distinct adapters than there are slots (``Scheduler._admit``).
"""

from __future__ import annotations


def assign_slots(table: list[int | None], wanted: set[int], last_used: dict[int, int]) -> dict[int, int]:
    """``{slot: adapter id}`` to write so that every id in ``wanted`` is in ``table``.

    ``table``: the adapter id in each slot (None: free); ``last_used``: id -> the step it was
    last needed in. Raises ValueError when ``wanted`` has more ids than there are slots."""
    if len(wanted) > len(table):
        raise ValueError(f"{len(wanted)} adapters in one step, {len(table)} slots")
    missing = sorted(wanted - set(table))
    free = [i for i, held in enumerate(table) if held is None]
    evictable = sorted((i for i, held in enumerate(table) if held is not None and held not in wanted),
                       key=lambda i: (last_used.get(table[i], -1), i))
    out: dict[int, int] = {}
    for lora_id in missing:
        slot = free.pop(0) if free else evictable.pop(0)
        out[slot] = lora_id
    return out
