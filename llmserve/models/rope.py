"""Rotary position embeddings with the model's rope settings (default, linear, llama3, longrope,
yarn, GGUF freq factors), over the whole head or its first ``rotary_dim`` dimensions (partial rotary)."""

from __future__ import annotations

import math
from typing import Any

import torch

from llmserve.models.rope_yarn import attention_factor, yarn_inv_frequencies


def inv_frequencies(dim: int, theta: float, scaling: dict[str, Any] | None,
                    long: bool = False) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "freq_factors":  # a GGUF's rope_freqs: Llama 3's scaling as one divisor per frequency
        return inv / torch.tensor(scaling["factors"], dtype=torch.float32)
    if kind == "longrope":
        ext = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (ext * theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        low_wl, high_wl = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wl) & (wavelen <= low_wl)
        return torch.where(is_mid, mid, scaled)
    if kind == "yarn":
        return yarn_inv_frequencies(dim, theta, scaling)
    raise ValueError(f"unsupported rope scaling type {kind!r}")


def _tables(inv: torch.Tensor, positions: torch.Tensor, mult: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.outer(positions.float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * mult, emb.sin() * mult


class RotaryEmbedding:
    """Precomputed cos/sin tables, indexed by absolute position (HF's rotate-half form)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None = None, rotary_dim: int | None = None) -> None:
        dim = rotary_dim or head_dim
        t = torch.arange(max_positions, dtype=torch.int64)
        self.long_offset, self.original = 0, max_positions
        if scaling and scaling.get("rope_type") == "longrope":
            # Phi-3, as transformers computes a forward pass: short factors while the sequence is
            # within the trained context, long ones for every position of a pass that reaches past
            # it. A prompt longer than that context is prefilled in one such pass, so all its
            # positions read the long factors: rows from ``long_offset`` on (offset_for). A shorter
            # prompt's rows switch at the boundary as its decode passes do. Both scaled alike.
            orig, mult = int(scaling["original_max_position_embeddings"]), float(scaling["attention_factor"])
            short = _tables(inv_frequencies(dim, theta, scaling), t[:orig], mult)
            long = _tables(inv_frequencies(dim, theta, scaling, long=True), t, mult)
            self.cos = torch.cat((short[0], long[0][orig:], long[0]))
            self.sin = torch.cat((short[1], long[1][orig:], long[1]))
            self.long_offset, self.original = max_positions, orig
        else:
            self.cos, self.sin = _tables(inv_frequencies(dim, theta, scaling), t, attention_factor(scaling))
        self.head_dim = head_dim
        self.rotary_dim = dim
        self.half = dim // 2

    def offset_for(self, prompt_len: int) -> int:
        """Added to a request's positions: the long factors' rows for a prompt past the trained
        context (0 otherwise, and for every other rope). Its KV is keyed by it (kv_cache)."""
        return self.long_offset if self.long_offset and prompt_len > self.original else 0

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [T, 1, rotary_dim] for broadcasting over heads."""
        return self.cos.index_select(0, positions).unsqueeze(1), self.sin.index_select(0, positions).unsqueeze(1)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rotary_dim < self.head_dim:
            rot, rest = x[..., :self.rotary_dim], x[..., self.rotary_dim:]
            return torch.cat((self._rotate(rot, cos, sin), rest), dim=-1)
        return self._rotate(x, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :self.half], x[..., self.half:]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * cos + rotated * sin
