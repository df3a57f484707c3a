"""LoRA adapters in the engine: which are known, loaded and resident (``manager``), the pure
choice of slots for a step (``residency``), the commands the clients send (``ops``), and vLLM's
``LoRARequest`` for the offline ``LLM`` (``request``)."""

from llmserve.engine.lora.request import LoRARequest

__all__ = ["LoRARequest"]
