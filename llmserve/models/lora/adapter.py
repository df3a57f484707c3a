"""A LoRA adapter as the decoder uses it, and where each of its modules lands in the model.

An adapter is a set of low-rank deltas ``W' = W + B @ A`` on some of the decoder's matrix
products, each keyed by (layer, module) in Hugging Face's names. The scaling (``alpha / r``,
or ``alpha / sqrt(r)`` for rsLoRA) is folded into ``B`` once, at load. The decoder fuses q/k/v
and gate/up into one product each (``llama._Layer``): a module's delta lands on a column range
of the fused output (:func:`model_modules`), so a ``q_proj`` adapter is a slice of ``qkv``.
Phi-3 is stored fused, and its adapters target ``qkv_proj`` / ``gate_up_proj`` whole.

Both readers (``peft_format``, ``gguf_format``) end in :func:`check`: every refusal is a
:class:`LoraError` naming the file and the problem, raised before anything is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from llmserve.models.config import ModelConfig


class LoraError(ValueError):
    """An adapter that cannot be served on this model (the API answers 400 with the message)."""


@dataclass(frozen=True, slots=True)
class ModuleSpot:
    """Where one adapter module's delta goes: a group (its own A/B stacks) of a fused product."""

    kind: str  # the decoder's product: qkv, o, gate_up, down
    group: int  # which of the kind's modules (q=0, k=1, v=2)
    start: int  # first output column in the fused product
    stop: int
    in_features: int


def model_modules(c: ModelConfig) -> dict[str, ModuleSpot]:
    """The modules an adapter may target on this model, in HF names."""
    q, kv, h, i = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.hidden_size, \
        c.intermediate_size
    spots = {"o_proj": ModuleSpot("o", 0, 0, h, q), "down_proj": ModuleSpot("down", 0, 0, h, i)}
    if c.family == "phi3":  # fused in the checkpoint, so in its adapters too
        return {**spots, "qkv_proj": ModuleSpot("qkv", 0, 0, q + 2 * kv, h),
                "gate_up_proj": ModuleSpot("gate_up", 0, 0, 2 * i, h)}
    return {**spots, "q_proj": ModuleSpot("qkv", 0, 0, q, h), "k_proj": ModuleSpot("qkv", 1, q, q + kv, h),
            "v_proj": ModuleSpot("qkv", 2, q + kv, q + 2 * kv, h),
            "gate_proj": ModuleSpot("gate_up", 0, 0, i, h), "up_proj": ModuleSpot("gate_up", 1, i, 2 * i, h)}


@dataclass(slots=True)
class LoraAdapter:
    """Deltas by (layer, module): ``A`` [r, in] and ``B`` [out, r], scaling already in ``B``."""

    name: str
    path: str
    deltas: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def rank(self) -> int:
        return max(a.shape[0] for a, _ in self.deltas.values())

    @property
    def modules(self) -> list[str]:
        return sorted({m for _, m in self.deltas})

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.deltas.values())


def scaling(alpha: float, rank: int, rslora: bool = False) -> float:
    """PEFT's: ``alpha / r``; rsLoRA's ``alpha / sqrt(r)`` keeps high ranks from fading."""
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def check(name: str, path: Path, pairs: dict[tuple[int, str], dict[str, torch.Tensor]], config: ModelConfig,
          max_rank: int, alphas: dict[tuple[int, str], float], rslora: bool = False) -> LoraAdapter:
    """The adapter of read ``pairs`` ((layer, module) -> {"A", "B"}), or a LoraError saying why not.

    ``alphas``: each pair's alpha (its scaling is computed from its own rank)."""
    spots = model_modules(config)
    if not pairs:
        raise LoraError(f"{path}: the adapter holds no LoRA weights")
    deltas: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), ab in sorted(pairs.items()):
        where = f"{path}: layer {layer} {module}"
        if module not in spots:
            raise LoraError(f"{path}: target module {module!r} is not in this {config.family} model "
                            f"(its modules: {', '.join(sorted(spots))})")
        if not 0 <= layer < config.num_hidden_layers:
            raise LoraError(f"{where}: the model has {config.num_hidden_layers} layers")
        if set(ab) != {"A", "B"}:
            raise LoraError(f"{where}: lora_{'A' if 'A' not in ab else 'B'} is missing")
        a, b, spot = ab["A"].float(), ab["B"].float(), spots[module]
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != spot.in_features or b.shape != (spot.stop - spot.start, r):
            raise LoraError(f"{where}: shapes A {tuple(a.shape)}, B {tuple(b.shape)} do not fit the model "
                            f"(A [r, {spot.in_features}], B [{spot.stop - spot.start}, r])")
        if r > max_rank:
            raise LoraError(f"{path}: rank {r} is over the maximum LoRA rank {max_rank} (--max-lora-rank)")
        if not (math.isfinite(a.sum().item()) and math.isfinite(b.sum().item())):
            raise LoraError(f"{where}: NaN or infinite weights")
        deltas[(layer, module)] = (a.contiguous(), (b * scaling(alphas[(layer, module)], r, rslora)).contiguous())
    return LoraAdapter(name, str(path), deltas)

