"""llama.cpp's GGUF LoRA (what ``convert_lora_to_gguf.py`` writes from a PEFT folder).

Metadata ``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``;
tensors ``blk.{i}.attn_q.weight.lora_a`` ([r, in] in torch order) and ``.lora_b`` ([out, r]).
The converter runs the base model's tensor mapping on ``B``, so for the architectures whose
Q/K rows llama.cpp interleaves (``gguf_families.PERMUTED_QK``) ``B``'s rows of q and k are
permuted like the weights: undone here as the model loader undoes them. llama.cpp scales a
delta by ``alpha / r`` (no alpha: 1).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from llmserve.models.config import ModelConfig
from llmserve.models.gguf_families import PERMUTED_QK, layer_names
from llmserve.models.gguf_loader import _dequantize, _fields, _open, reverse_permute
from llmserve.models.loader import ModelLoadError
from llmserve.models.lora.adapter import LoraAdapter, LoraError, check

_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight\.lora_([ab])")
# our families as llama.cpp names their architecture
_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
         "gemma3": "gemma3", "phi3": "phi3"}


def read_gguf_lora(name: str, path: Path, config: ModelConfig, max_rank: int) -> LoraAdapter:
    try:
        reader = _open(path)
        meta = _fields(reader, path)
    except ModelLoadError as e:
        raise LoraError(str(e)) from e
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise LoraError(f"{path}: not a GGUF LoRA adapter (general.type {meta.get('general.type')!r}, "
                        f"adapter.type {meta.get('adapter.type')!r})")
    arch = meta.get("general.architecture")
    if arch != _ARCH.get(config.family):
        raise LoraError(f"{path}: an adapter for architecture {arch!r}; the model is {config.family}")
    names = {k: v.rsplit(".", 1)[-1] for k, v in layer_names(arch).items()}
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for t in reader.tensors:
        m = _NAME.fullmatch(t.name)
        if m is None or m.group(2) not in names:
            raise LoraError(f"{path}: tensor {t.name!r} is not a LoRA weight of a decoder layer (not supported)")
        try:
            w = _dequantize(t, path)
        except ModelLoadError as e:
            raise LoraError(str(e)) from e
        module = names[m.group(2)]
        if m.group(3) == "b" and arch in PERMUTED_QK and module in ("q_proj", "k_proj"):
            heads = config.num_attention_heads if module == "q_proj" else config.num_key_value_heads
            w = torch.from_numpy(reverse_permute(w.numpy(), heads).copy())
        pairs.setdefault((int(m.group(1)), module), {})[m.group(3).upper()] = w
    alpha = meta.get("adapter.lora.alpha")
    alphas = {k: float(alpha) if alpha else float(ab["A"].shape[0]) for k, ab in pairs.items() if "A" in ab}
    alphas.update({k: 1.0 for k in pairs if k not in alphas})
    return check(name, path, pairs, config, max_rank, alphas)
