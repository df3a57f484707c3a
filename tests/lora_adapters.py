"""Random PEFT LoRA adapters over the tiny family models, and their merged-weight oracles."""

from __future__ import annotations

import copy
from pathlib import Path

import torch


def make_adapter(hf_model, folder: Path, r: int, targets: list[str], seed: int, alpha: float | None = None,
                 rslora: bool = False, scale: float = 0.3):
    """Save a random LoRA of rank ``r`` on ``targets`` to ``folder``; returns the merged model
    (peft's ``merge_and_unload`` on a copy of ``hf_model``)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha if alpha is not None else 2 * r, target_modules=targets,
                     init_lora_weights=False, use_rslora=rslora, lora_dropout=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(copy.deepcopy(hf_model), cfg)
        with torch.no_grad():  # deltas the size of the weights': an adapter that is ignored changes tokens
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn_like(p) * scale)
    peft_model.save_pretrained(folder)
    return peft_model.merge_and_unload().eval()
