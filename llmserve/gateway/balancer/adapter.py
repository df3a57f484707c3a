"""``adapter``: where a request on a LoRA adapter may go, before any scorer runs.

A filter, not a scorer: an instance that has the adapter resident serves the
request at once, one that lacks it must load it first (hundreds of milliseconds,
and a slot of its ``--max-loras``), so residency is not one signal to weigh
against load but a precondition. The rule (S-LoRA's and AIBrix's shape):

- a request on the base model (no adapter): every candidate;
- else the candidates where the adapter is resident (in one of the engine's
  ``--max-loras`` slots), and the scorers pick among them by load as usual;
- else those where it is loaded in memory only (a copy into a slot away), or
  being loaded by this gateway (so followers wait for that one load);
- else none has it: the least loaded candidates, and the one picked loads it.

``candidates`` are those with room already, so a resident instance at its
concurrency target does not hold the request back: the adapter spreads to a
second instance under load, as a version's pool grows with its traffic.
Pure: the live pool and the simulator's gateway both call it through the picker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmserve.gateway.instance import InstanceView


@dataclass(slots=True)  # not frozen: one per pick, and frozen fields are set dearly
class Placement:
    candidates: Sequence[InstanceView]  # the ones the scorers choose among
    loads: bool  # True: none has the adapter, the chosen one must load it


def place(adapter: str | None, candidates: Sequence[InstanceView]) -> Placement:
    """The candidates a request on ``adapter`` may go to (``candidates`` non-empty)."""
    if adapter is None:
        return Placement(candidates, False)
    for has in ([c for c in candidates if adapter in c.adapters],
                [c for c in candidates if adapter in c.adapters_loaded]):
        if has:
            return Placement(has, False)
    least = min(c.est_load for c in candidates)
    return Placement([c for c in candidates if c.est_load == least], True)
