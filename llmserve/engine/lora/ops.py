"""Building the engine's LoRA state from its config, and the core-side commands on it.

The clients (in-thread, multi-process) run these on the engine's thread; both answer with
:func:`lora_state`, the same plain data, so the API process can say which adapters exist
without asking again.
"""

from __future__ import annotations

from typing import Any

import torch

from llmserve.engine.lora.manager import LoraManager
from llmserve.models.errors import FlagError
from llmserve.models.lora.adapter import LoraAdapter, LoraError
from llmserve.models.lora.slots import LoraSlots, install


def build_lora(config, model_config, model) -> LoraManager | None:
    """The adapters of ``config`` (an ``EngineConfig``), read and checked; None without LoRA.
    A bad ``--lora-modules`` entry stops the start with its ``LoraError``."""
    if not config.lora_enabled:
        return None
    slots = LoraSlots(model_config, config.max_loras, config.max_lora_rank, dtype=lora_dtype(config))
    install(model, slots)
    manager = LoraManager(model_config, slots, config.max_lora_rank, config.max_cpu_loras or config.max_loras)
    for name, path in config.lora_modules.items():
        try:
            manager.add(manager.read(name, path))
        except LoraError as e:  # (a bad flag: one line, exit 2, not a traceback from the engine process)
            raise FlagError(f"--lora-modules: {e}") from e
    return manager


def lora_dtype(config) -> torch.dtype:
    """The factors' storage: fp16 beside int8 weights where the C++ kernel reads them (already
    judged by the lossy bar; the factors' reads are most of a LoRA product's cost), fp32 beside
    float weights, and where torch's ops would have to widen them on every product."""
    from llmserve.models import kernels

    want = config.lora_dtype
    if want == "auto":
        want = "fp16" if config.dtype in ("int8", "w8a8") and kernels.load() is not None else "fp32"
    return torch.float16 if want == "fp16" else torch.float32


def need(manager: LoraManager | None) -> LoraManager:
    if manager is None:
        raise LoraError("this engine serves no LoRA adapters (start it with --enable-lora)")
    return manager


def add(manager: LoraManager | None, adapter: LoraAdapter) -> dict[str, Any]:
    need(manager).add(adapter)
    return lora_state(manager)


def remove(manager: LoraManager | None, name: str) -> dict[str, Any]:
    need(manager).remove(name)
    return lora_state(manager)


def lora_state(manager: LoraManager | None) -> dict[str, Any]:
    """``adapters``: name -> path of every registered adapter; ``resident`` / ``loaded``: names."""
    if manager is None:
        return {"adapters": {}, "resident": [], "loaded": []}
    return {"adapters": manager.paths(), "resident": manager.resident(), "loaded": manager.loaded()}


def error_kind(e: Exception) -> str:
    """How a refusal crosses the process boundary (``error_of`` undoes it): an adapter load's
    or unload's, or a request's at enqueue."""
    from llmserve.engine.lora.manager import AdapterUnavailable, UnknownAdapter

    for kind, cls in (("unknown", UnknownAdapter), ("unavailable", AdapterUnavailable), ("lora", LoraError),
                      ("value", ValueError)):
        if isinstance(e, cls):
            return kind
    return "other"


def error_of(kind: str, message: str) -> Exception:
    from llmserve.engine.lora.manager import AdapterUnavailable, UnknownAdapter

    return {"unknown": UnknownAdapter, "unavailable": AdapterUnavailable, "lora": LoraError,
            "value": ValueError}.get(kind, RuntimeError)(message)
