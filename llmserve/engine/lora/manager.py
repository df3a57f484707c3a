"""The engine's adapters: known by name, kept loaded (CPU, least recently used out), resident.

Three levels, vLLM's: *registered* (a name and its path: ``--lora-modules`` and
``/v1/load_lora_adapter``), *loaded* (its tensors in memory, at most ``max_cpu_loras`` of the
ones no request uses) and *resident* (in one of ``max_loras`` slots of :class:`LoraSlots`,
where a step reads it; the slot is then its one copy). A request names an adapter; at enqueue
it gets the adapter's id, an id per load, so a name unloaded and loaded again with other
weights never meets the old KV (the prefix cache keys blocks by it). A request pins its adapter in memory until it ends:
unloading a name refuses new requests at once and frees the tensors after the last of its
running ones. Everything here runs on the engine's thread, except :meth:`read`.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from llmserve.engine.lora.residency import assign_slots
from llmserve.models.config import ModelConfig
from llmserve.models.lora.adapter import LoraAdapter, LoraError
from llmserve.models.lora.read import read_adapter
from llmserve.models.lora.slots import LoraSlots


@dataclass(slots=True)
class _Known:
    name: str
    path: str
    lora_id: int
    files: tuple  # the files' (name, size, mtime) when read: a change means other weights


class UnknownAdapter(ValueError):
    """A request or an unload names no registered adapter."""


class AdapterUnavailable(LoraError):
    """An evicted adapter's file could not be read again: the name is unregistered (a
    request for it fails alone; a later load, from a path that works, brings it back)."""


def _files(path: str) -> tuple:
    p = Path(path).expanduser()
    try:
        found = sorted(p.iterdir()) if p.is_dir() else [p]
        return tuple((f.name, (st := os.stat(f)).st_size, st.st_mtime_ns) for f in found if f.is_file())
    except OSError:
        return ()


class LoraManager:
    def __init__(self, config: ModelConfig, slots: LoraSlots, max_rank: int, max_cpu_loras: int) -> None:
        self.config, self.slots, self.max_rank, self.max_cpu_loras = config, slots, max_rank, max_cpu_loras
        self._known: dict[str, _Known] = {}
        self._loaded: OrderedDict[int, LoraAdapter] = OrderedDict()  # least recently used first
        self._table: list[int | None] = [None] * slots.num_slots
        self._users: dict[int, int] = {}
        self._of_request: dict[str, int] = {}
        self._gone: set[int] = set()  # unloaded while requests still ran on them
        self._names: dict[int, str] = {}
        self._last_used: dict[int, int] = {}
        self._step = 0
        self._next_id = 1

    # ---- registry (engine thread) -------------------------------------------------------
    def read(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter file; no state changes (safe off the engine thread)."""
        return read_adapter(name, path, self.config, self.max_rank)

    def add(self, adapter: LoraAdapter) -> int:
        """Register a read adapter under its name; LoraError if the name is taken."""
        if adapter.name in self._known:
            raise LoraError(f"the LoRA adapter {adapter.name!r} is already loaded")
        lora_id, self._next_id = self._next_id, self._next_id + 1
        self._known[adapter.name] = _Known(adapter.name, adapter.path, lora_id, _files(adapter.path))
        self._names[lora_id] = adapter.name
        self._loaded[lora_id] = adapter
        self._trim()
        return lora_id

    def remove(self, name: str) -> None:
        known = self._known.pop(name, None)
        if known is None:
            raise UnknownAdapter(f"the LoRA adapter {name!r} is not loaded")
        self._gone.add(known.lora_id)
        self._drop_if_unused(known.lora_id)

    def paths(self) -> dict[str, str]:
        return {k.name: k.path for k in self._known.values()}

    # ---- requests ----------------------------------------------------------------------
    def acquire(self, request_id: str, name: str) -> int:
        """The id of ``name`` for a new request, its tensors loaded (read again if evicted)."""
        known = self._known.get(name)
        if known is None:
            raise UnknownAdapter(f"the LoRA adapter {name!r} is not loaded")
        if known.lora_id not in self._loaded:
            self._reread(known)
        self._loaded.move_to_end(known.lora_id)
        self._users[known.lora_id] = self._users.get(known.lora_id, 0) + 1
        self._of_request[request_id] = known.lora_id
        return known.lora_id

    def _reread(self, known: _Known) -> None:
        try:
            adapter = self.read(known.name, known.path)
        except (LoraError, OSError) as e:
            self.remove(known.name)
            raise AdapterUnavailable(f"the LoRA adapter {known.name!r} could not be read again from "
                                     f"{known.path} ({e}); it is unloaded") from None
        files = _files(known.path)
        if files != known.files:  # other weights under the same path: their KV must not meet the old
            self._names.pop(known.lora_id, None)
            known.lora_id, known.files, self._next_id = self._next_id, files, self._next_id + 1
            self._names[known.lora_id] = known.name
        self._loaded[known.lora_id] = adapter

    def release(self, request_id: str) -> None:
        lora_id = self._of_request.pop(request_id, None)
        if lora_id is None:
            return
        self._users[lora_id] -= 1
        if not self._users[lora_id]:
            del self._users[lora_id]
            self._drop_if_unused(lora_id)
            self._trim()

    # ---- steps -------------------------------------------------------------------------
    def activate(self, wanted: set[int]) -> dict[int, int]:
        """Make every adapter id of a step resident; returns id -> slot."""
        self._step += 1
        writes = assign_slots(self._table, wanted, self._last_used)
        for slot, lora_id in writes.items():
            moved = self._table[slot]
            if moved is not None and moved in self._loaded:
                self._loaded[moved].deltas = self.slots.read(slot)  # its one copy leaves the slot
            adapter = self._loaded[lora_id]
            self.slots.write(slot, adapter)
            adapter.deltas = {}  # the slot is its one copy now (the engine's memory is the CPU's)
            self._table[slot] = lora_id
        if writes:
            self._trim()  # (an adapter moved out of its slot may now be evicted)
        for lora_id in wanted:
            self._last_used[lora_id] = self._step
            self._loaded.move_to_end(lora_id)
        return {lora_id: slot for slot, lora_id in enumerate(self._table) if lora_id in wanted}

    # ---- introspection -----------------------------------------------------------------
    def resident(self) -> list[str]:
        return sorted(self._names[i] for i in self._table if i is not None and i not in self._gone)

    def loaded(self) -> list[str]:
        return sorted(self._names[i] for i in self._loaded if i not in self._gone)

    def _drop_if_unused(self, lora_id: int) -> None:
        if lora_id not in self._gone or self._users.get(lora_id):
            return
        self._gone.discard(lora_id)
        self._loaded.pop(lora_id, None)
        self._names.pop(lora_id, None)
        self._last_used.pop(lora_id, None)
        if lora_id in self._table:
            slot = self._table.index(lora_id)
            self._table[slot] = None
            self.slots.clear(slot)

    def _trim(self) -> None:
        """Evict the least recently used loaded adapters that no request uses and no slot holds."""
        idle = [i for i in self._loaded if not self._users.get(i) and i not in self._table]
        while len(self._loaded) > self.max_cpu_loras and idle:
            self._loaded.pop(idle.pop(0))
