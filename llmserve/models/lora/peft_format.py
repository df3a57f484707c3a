"""PEFT's LoRA folder: ``adapter_config.json`` and ``adapter_model.safetensors``.

Tensors are named ``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``
(``A`` [r, in], ``B`` [out, r]). PEFT options that change the arithmetic beyond
``B @ A * scaling`` (DoRA, trained biases, extra trained modules, ``fan_in_fan_out``,
per-module alphas) are refused by name, never served approximately; ``rank_pattern``
needs nothing: each module's rank is its tensors' and sets its scaling.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from llmserve.models.config import ModelConfig
from llmserve.models.files import read_json_object
from llmserve.models.lora.adapter import LoraAdapter, LoraError, check, model_modules

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_PART = re.compile(r"\.lora_([AB])\.weight$")


def _config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    d = read_json_object(path, "the adapter config", LoraError)
    kind = d.get("peft_type", "LORA")
    if kind != "LORA":
        raise LoraError(f"{path}: peft_type {kind!r} is not supported (LORA only)")
    refused = [k for k, off in (("use_dora", False), ("fan_in_fan_out", False), ("modules_to_save", None),
                                ("alpha_pattern", {}), ("layer_replication", None))
               if d.get(k) not in (off, None, [], {})]
    if d.get("bias", "none") != "none":
        refused.append("bias")
    if refused:
        raise LoraError(f"{path}: adapter options not supported: {', '.join(refused)}")
    try:
        d["lora_alpha"] = float(d.get("lora_alpha", d.get("r", 8)))
    except (TypeError, ValueError) as e:
        raise LoraError(f"{path}: lora_alpha is not a number") from e
    return d


def read_peft(name: str, folder: Path, config: ModelConfig, max_rank: int) -> LoraAdapter:
    d = _config(folder)
    targets = d.get("target_modules")
    if isinstance(targets, list):  # (a string is a regular expression: the tensors say what it matched)
        spots = model_modules(config)
        for t in targets:
            if str(t).rsplit(".", 1)[-1] not in spots:
                raise LoraError(f"{folder}: target module {t!r} is not in this {config.family} model "
                                f"(its modules: {', '.join(sorted(spots))})")
    path = folder / WEIGHTS
    if not path.is_file():
        raise LoraError(f"{folder}: no {WEIGHTS} (adapter_model.bin is not supported)")
    from safetensors.torch import load_file

    try:
        tensors: dict[str, torch.Tensor] = load_file(path, device="cpu")
    except Exception as e:  # SafetensorError, OSError, a header that does not parse
        raise LoraError(f"{path}: corrupt or truncated safetensors file ({e})") from e
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        part = _PART.search(key)
        if part is None:
            raise LoraError(f"{path}: tensor {key!r} is not a LoRA A/B weight (not supported)")
        prefix = key[:part.start()]
        module, layer = prefix.rsplit(".", 1)[-1], _LAYER.search(prefix)
        if layer is None:
            raise LoraError(f"{path}: target module {module!r} is not a decoder layer's (not supported)")
        pairs.setdefault((int(layer.group(1)), module), {})[part.group(1)] = t
    alphas = {k: d["lora_alpha"] for k in pairs}
    return check(name, folder, pairs, config, max_rank, alphas, rslora=bool(d.get("use_rslora")))
