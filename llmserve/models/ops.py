"""The model's small steps (RMSNorm with the residual add, per-head q / k RMSNorm, RoPE with
the KV write, SwiGLU's and GeGLU's gates, greedy sampling's argmax), in two interchangeable forms.

:class:`TorchOps` composes torch ops and is the reference. :class:`FusedOps` runs each
step as one C++ call (``csrc/fused_ops.cpp``): in a decode step these steps see a row or
a few, where torch's ~10 dispatches per step cost more than the arithmetic. Tests hold
the two equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmserve.models import kernels
from llmserve.models.rope import RotaryEmbedding


class TorchOps:
    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def add_rms_norm_(self, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """``x += r`` (the residual stream, in place), then RMSNorm of ``x``."""
        x.add_(r)
        return self.rms_norm(x, w, eps)

    def silu_mul(self, gu: torch.Tensor) -> torch.Tensor:
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    def gelu_mul(self, gu: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
        """GeGLU's gate (Gemma): gelu(gate) * up."""
        g, u = gu.chunk(2, dim=-1)
        return F.gelu(g, approximate=approximate) * u

    def qk_norm_(self, qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor, heads: int, kv_heads: int,
                 eps: float) -> None:
        """RMSNorm over each q head and each k head of ``qkv`` [T, (H + 2 KVH) D], in place."""
        t, d = qkv.shape[0], qw.shape[0]
        q, k = qkv[:, :heads * d], qkv[:, heads * d:(heads + kv_heads) * d]
        q.copy_(F.rms_norm(q.reshape(t, heads, d), (d,), qw, eps).view(t, -1))
        k.copy_(F.rms_norm(k.reshape(t, kv_heads, d), (d,), kw, eps).view(t, -1))

    def rope_and_cache_(self, qkv: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                        heads: int, kv_heads: int) -> torch.Tensor:
        """Rotates q and k, writes k and v to the pool rows ``slots``; returns q [T, H, D]."""
        t, d = qkv.shape[0], rope.head_dim
        q_size, kv_size = heads * d, kv_heads * d
        cos, sin = rope.tables(positions)
        q = rope.apply(qkv[:, :q_size].view(t, heads, d), cos, sin)
        k = rope.apply(qkv[:, q_size:q_size + kv_size].view(t, kv_heads, d), cos, sin)
        v = qkv[:, q_size + kv_size:].view(t, kv_heads, d)
        k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, slots, v.to(v_cache.dtype))
        return q

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Index of each row's first maximum."""
        return logits.argmax(dim=-1)


class FusedOps(TorchOps):
    def __init__(self, module) -> None:
        self.k = module

    def rms_norm(self, x, w, eps):
        return self.k.rms_norm(x, w, eps)

    def add_rms_norm_(self, x, r, w, eps):
        return self.k.add_rms_norm_(x, r, w, eps)

    def silu_mul(self, gu):
        return self.k.silu_mul(gu)

    def gelu_mul(self, gu, approximate="tanh"):
        return self.k.gelu_tanh_mul(gu) if approximate == "tanh" else super().gelu_mul(gu, approximate)

    def qk_norm_(self, qkv, qw, kw, heads, kv_heads, eps):
        self.k.qk_norm_(qkv, qw, kw, heads, kv_heads, eps)

    def argmax(self, logits):
        return self.k.argmax_rows(logits.float().contiguous())

    def rope_and_cache_(self, qkv, positions, rope, k_cache, v_cache, slots, heads, kv_heads):
        # the kernel writes these pools, rotating whole heads
        if k_cache.dtype not in (torch.float32, torch.float16) or rope.rotary_dim != rope.head_dim:
            return super().rope_and_cache_(qkv, positions, rope, k_cache, v_cache, slots, heads, kv_heads)
        self.k.rope_and_cache_(qkv, positions, rope.cos, rope.sin, k_cache, v_cache, slots, heads, kv_heads)
        return qkv[:, :heads * rope.head_dim].view(qkv.shape[0], heads, rope.head_dim)


def layer_ops() -> TorchOps:
    """The fused form where the kernels load, else the torch form."""
    module = kernels.load()
    return FusedOps(module) if module is not None else TorchOps()
