"""YaRN rope scaling (https://arxiv.org/abs/2309.00071) as transformers computes it
(``modeling_rope_utils._compute_yarn_parameters``): each frequency blended between
interpolated (divided by ``factor``) and the original by a linear ramp over the dimensions
whose rotations in the trained context fall between ``beta_slow`` and ``beta_fast``; cos and
sin scaled by the attention factor. The same for every position, so unlike dynamic NTK a
cached key never needs recomputing.

``scaling`` is HF's ``rope_scaling`` with ``factor`` and ``original_max_position_embeddings``
resolved (families.py, gguf_loader.py)."""

from __future__ import annotations

import math
from typing import Any

import torch


def mscale(scale: float, m: float = 1.0) -> float:
    """The paper's attention temperature for a context stretched ``scale`` times."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def attention_factor(scaling: dict[str, Any] | None) -> float:
    """What cos and sin are multiplied by: 1 for every rope but YaRN."""
    if not scaling or scaling.get("rope_type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, m, m_all = float(scaling["factor"]), scaling.get("mscale"), scaling.get("mscale_all_dim")
    if m and m_all:  # DeepSeek-style: the ratio of two temperatures
        return float(mscale(factor, float(m)) / mscale(factor, float(m_all)))
    return mscale(factor)


def _correction_dim(rotations: float, dim: int, base: float, original: int) -> float:
    """The dimension whose frequency turns ``rotations`` times over the trained context."""
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_inv_frequencies(dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    original = scaling["original_max_position_embeddings"]
    # `or`, as transformers reads them: a 0 or null means the paper's default
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low = _correction_dim(beta_fast, dim, theta, original)
    high = _correction_dim(beta_slow, dim, theta, original)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of no width would divide by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: the original frequency (fast dimensions), 0: interpolated (slow ones)
    return interpolation * (1 - keep) + extrapolation * keep
