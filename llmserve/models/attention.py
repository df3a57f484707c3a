"""Attention over a paged KV pool.

The KV pool of a layer is one tensor of ``num_slots = num_blocks * block_size`` rows;
token ``t`` of a request lives in row ``block_table[t // bs] * bs + t % bs``. Each step
writes the new tokens' K/V to their slots, then attends per *group*: requests with
the same number of query tokens (all decodes form one group) share one batched
``scaled_dot_product_attention`` call over their gathered, padded contexts. The
gather indices and masks are built once per step and reused by every layer.

A decode group (one new token per sequence) on an fp32 pool goes to our C++ kernel
instead (``csrc/paged_attention.cpp``), which reads each key and value where it lies
in the pool: no gathered copy of every context, every layer, every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from llmserve.models import kernels


@dataclass
class AttnGroup:
    start: int  # first token row of the group in the flat batch
    num_seqs: int
    q_len: int
    kv_index: torch.Tensor  # [B, Lk] slot ids of each sequence's context (padded)
    mask: torch.Tensor  # [B, 1, n_rep * q_len, Lk] True where attention is allowed
    lens: torch.Tensor | None = None  # [B] context lengths


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] slot of each new token
    groups: list[AttnGroup] = field(default_factory=list)
    _windowed: dict[int, list[AttnGroup]] = field(default_factory=dict, repr=False)

    def groups_for(self, window: int | None) -> list[AttnGroup]:
        """The groups as a layer with this sliding window sees them (built once per step)."""
        if window is None:
            return self.groups
        if window not in self._windowed:
            self._windowed[window] = [windowed(g, window) for g in self.groups]
        return self._windowed[window]


def build_group(start: int, q_len: int, context_lens: list[int], block_tables: list[list[int]],
                block_size: int, n_rep: int) -> AttnGroup:
    """Gather indices and causal masks for sequences whose last ``q_len`` tokens are new."""
    b = len(context_lens)
    lk = max(context_lens)
    pos = torch.arange(lk)
    nb = -(-lk // block_size)
    blocks = torch.tensor([bt[:nb] + [0] * (nb - len(bt[:nb])) for bt in block_tables], dtype=torch.long)
    kv_index = blocks.index_select(1, pos // block_size) * block_size + (pos % block_size)
    ctx = torch.tensor(context_lens).view(b, 1, 1)
    # query i of a sequence sits at absolute position ctx - q_len + i
    q_pos = ctx - q_len + torch.arange(q_len).view(1, q_len, 1)
    mask = pos.view(1, 1, lk) <= q_pos  # also masks padding: pos > q_pos >= ... < ctx
    mask = mask.unsqueeze(1).repeat(1, 1, n_rep, 1)
    return AttnGroup(start, b, q_len, kv_index, mask, ctx.view(b))


def windowed(g: AttnGroup, window: int) -> AttnGroup:
    """The group with each query seeing only the ``window`` latest keys, itself included
    (transformers' sliding mask: key position > query position - window)."""
    lens = g.lens
    if g.q_len == 1:
        # decode: gather the window itself, so the kernel reads no key outside it
        new_lens = lens.clamp(max=window)
        width = int(new_lens.max())
        cols = ((lens - new_lens).view(-1, 1) + torch.arange(width).view(1, -1)).clamp(max=g.kv_index.shape[1] - 1)
        valid = torch.arange(width).view(1, -1) < new_lens.view(-1, 1)
        n_rep = g.mask.shape[2]
        mask = valid.view(g.num_seqs, 1, 1, width).expand(-1, 1, n_rep, -1).contiguous()
        return AttnGroup(g.start, g.num_seqs, 1, g.kv_index.gather(1, cols), mask, new_lens)
    lo = max(0, int(lens.min()) - g.q_len - window + 1)  # keys left of every query's window
    pos = torch.arange(lo, g.kv_index.shape[1])
    q_pos = lens.view(-1, 1, 1) - g.q_len + torch.arange(g.q_len).view(1, -1, 1)
    near = (pos.view(1, 1, -1) > q_pos - window).unsqueeze(1)
    n_rep = g.mask.shape[2] // g.q_len
    mask = g.mask[..., lo:] & near.repeat(1, 1, n_rep, 1)
    return AttnGroup(g.start, g.num_seqs, g.q_len, g.kv_index[:, lo:].contiguous(), mask, None)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, window: int | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """q: [T, H, D]; caches: [S, KVH, D], the step's new keys and values already written.
    ``window``: the layer's sliding window; ``softcap``: Gemma 2's cap on the scores.
    Returns [T, H * D]."""
    t, h, d = q.shape
    kvh = k_cache.shape[1]
    groups = meta.groups_for(window)
    # (the kernel reads heads 8 floats at a time: other head sizes take the torch path)
    kernel = _decode_kernel() if k_cache.dtype in (torch.float32, torch.float16) and q.dtype == torch.float32 \
        and softcap is None and d % 8 == 0 else None
    if kernel is not None and len(groups) == 1 and groups[0].q_len == 1 and groups[0].lens is not None:
        g = groups[0]  # a pure decode step (the common case): no output copy
        return kernel.paged_decode_attention(q, k_cache, v_cache, g.kv_index, g.lens, scale).view(t, h * d)
    out = torch.empty(t, h * d, dtype=q.dtype)
    for g in groups:
        b, lq = g.num_seqs, g.q_len
        rows = slice(g.start, g.start + b * lq)
        if kernel is not None and lq == 1 and g.lens is not None:
            o = kernel.paged_decode_attention(q[rows], k_cache, v_cache, g.kv_index, g.lens, scale)
            out[rows] = o.view(b, h * d)
            continue
        # Fold the query heads that share a KV head into the query-length axis, so
        # grouped-query attention needs no copy of K/V per query head.
        qg = q[rows].view(b, lq, h, d).permute(0, 2, 1, 3).reshape(b, kvh, (h // kvh) * lq, d)
        flat = g.kv_index.view(-1)  # index_select is several times faster than fancy indexing here
        kg = k_cache.index_select(0, flat).view(b, -1, kvh, d).permute(0, 2, 1, 3)
        vg = v_cache.index_select(0, flat).view(b, -1, kvh, d).permute(0, 2, 1, 3)
        if kg.dtype != qg.dtype:
            kg, vg = kg.to(qg.dtype), vg.to(qg.dtype)
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=scale) if softcap is None \
            else _capped_attention(qg, kg, vg, g.mask, scale, softcap)
        out[rows] = o.reshape(b, h, lq, d).permute(0, 2, 1, 3).reshape(b * lq, h * d)
    return out


def _capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float, cap: float) -> torch.Tensor:
    """Attention with scores capped as ``cap * tanh(score / cap)`` before the mask and softmax."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _decode_kernel():
    """The compiled kernels, or None (no compiler, no AVX2, or kernels.disable() called)."""
    return kernels.load()
