"""vLLM's ``LoRARequest``: the offline ``LLM``'s way of naming a request's adapter.

The engine keys adapters by name (``LoraManager``); vLLM keys them by ``lora_int_id`` too, so
:func:`resolve` holds both to one adapter each: a name or an id seen with other values is a
``ValueError`` rather than a silent second adapter, or the first one's weights under a new path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class LoRARequest:
    """``LoRARequest(lora_name, lora_int_id, lora_path)``: a PEFT folder or a GGUF LoRA file."""

    lora_name: str
    lora_int_id: int
    lora_path: str = field(default="")

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:  # vLLM's rule: id 0 is the base model's
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def resolve(manager: Any, lora_request: LoRARequest | Sequence[LoRARequest | None] | None, count: int,
            ids: dict[int, str]) -> tuple[list[str | None], list[Any], dict[int, str]]:
    """Each of ``count`` prompts' adapter name, and the adapters not yet registered, read and
    checked here (no state changes: the caller registers them, so a bad path leaves nothing).

    ``manager``: the engine's ``LoraManager`` (None: built without LoRA); ``ids``: the id ->
    name pairs already used; the third value is them with this call's (the caller keeps it
    once the call's requests are all added)."""
    reqs = list(lora_request) if isinstance(lora_request, (list, tuple)) else [lora_request] * count
    if len(reqs) != count:
        raise ValueError("need one lora_request or one per prompt")
    if all(r is None for r in reqs):
        return [None] * count, [], ids
    if manager is None:
        raise ValueError("a lora_request needs LoRA enabled: build the LLM with enable_lora=True "
                         "(and max_lora_rank / max_loras to fit the adapters)")
    known, new, seen = manager.paths(), {}, dict(ids)
    for r in reqs:
        if r is None:
            continue
        if not isinstance(r, LoRARequest):
            raise TypeError(f"lora_request takes LoRARequest objects, got {type(r).__name__}")
        if seen.setdefault(r.lora_int_id, r.lora_name) != r.lora_name:
            raise ValueError(f"lora_int_id {r.lora_int_id} is the LoRA adapter {seen[r.lora_int_id]!r}, "
                             f"not {r.lora_name!r}")
        path = known.get(r.lora_name) or (new[r.lora_name].path if r.lora_name in new else None)
        if path is not None:
            if not _same_path(path, r.lora_path):
                raise ValueError(f"the LoRA adapter {r.lora_name!r} is loaded from {path}, not {r.lora_path}")
            continue
        new[r.lora_name] = manager.read(r.lora_name, r.lora_path)  # (a LoraError names the path)
    return [None if r is None else r.lora_name for r in reqs], list(new.values()), seen
