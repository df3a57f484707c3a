"""llmserve: an elastic, OpenAI-compatible LLM serving platform.

The engine API (``LLM``, ``SamplingParams``, ``InThreadEngine``) is imported lazily so
that the gateway and controller, which never need torch, stay light.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "InThreadEngine", "EngineClient", "EngineConfig", "RequestOutput",
           "LoRARequest"]

_LAZY = {
    "LLM": "llmserve.engine.llm",
    "SamplingParams": "llmserve.engine.sampling_params",
    "InThreadEngine": "llmserve.engine.in_thread",
    "EngineClient": "llmserve.engine.client",
    "EngineConfig": "llmserve.engine.config",
    "RequestOutput": "llmserve.engine.outputs",
    "LoRARequest": "llmserve.engine.lora.request",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'llmserve' has no attribute {name!r}")
