"""Reading an adapter from disk, whichever of the two formats it is in."""

from __future__ import annotations

from pathlib import Path

from llmserve.models.config import ModelConfig
from llmserve.models.lora.adapter import LoraAdapter, LoraError
from llmserve.models.lora.gguf_format import read_gguf_lora
from llmserve.models.lora.peft_format import read_peft


def read_adapter(name: str, path: str | Path, config: ModelConfig, max_rank: int) -> LoraAdapter:
    """A PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``) or a GGUF LoRA file."""
    p = Path(path).expanduser()
    if p.is_dir():
        return read_peft(name, p, config, max_rank)
    if p.is_file() and p.suffix.lower() == ".gguf":
        return read_gguf_lora(name, p, config, max_rank)
    if not p.exists():
        raise LoraError(f"{p}: no such adapter (a PEFT folder or a .gguf LoRA file)")
    raise LoraError(f"{p}: not a LoRA adapter (a PEFT folder or a .gguf LoRA file)")
