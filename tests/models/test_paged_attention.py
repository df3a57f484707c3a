"""Decode attention read straight from the paged pool (the C++ kernel) against the
gather + SDPA path it replaces, on scattered blocks, uneven contexts and grouped-query heads."""

from __future__ import annotations

import pytest
import torch

import llmserve.models.attention as attention
from llmserve.models import kernels
from llmserve.models.attention import AttentionMetadata, build_group, paged_attention
from tests.kernel_gate import require_kernels


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 32), (8, 2, 40)])
@pytest.mark.parametrize("batch", [1, 5, 33])
def test_the_kernel_equals_gather_and_sdpa(monkeypatch, heads, kv_heads, dim, batch, cache_dtype):
    require_kernels()
    g = torch.Generator().manual_seed(batch * 100 + heads)
    bs, blocks = 4, 512
    k_cache = torch.randn(blocks * bs, kv_heads, dim, generator=g)
    v_cache = torch.randn(blocks * bs, kv_heads, dim, generator=g)
    lens = [1] + [int(x) for x in torch.randint(1, 60, (batch - 1,), generator=g)]
    order = torch.randperm(blocks, generator=g).tolist()
    tables, used = [], 0
    for n in lens:
        need = -(-n // bs)
        tables.append(order[used:used + need])
        used += need
    slots = torch.tensor([t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)])
    meta = AttentionMetadata(slots, [build_group(0, 1, lens, tables, bs, heads // kv_heads)])
    q = torch.randn(batch, heads, dim, generator=g)
    k = torch.randn(batch, kv_heads, dim, generator=g)
    v = torch.randn(batch, kv_heads, dim, generator=g)
    k_cache[slots], v_cache[slots] = k, v  # the step's new tokens, written before attention
    k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    fast = paged_attention(q, k_cache, v_cache, meta, dim ** -0.5)
    monkeypatch.setattr(attention, "_decode_kernel", lambda: None)
    ref = paged_attention(q, k_cache, v_cache, meta, dim ** -0.5)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    grp = meta.groups[0]  # the kernel itself, whatever paged_attention routes to it
    direct = kernels.load().paged_decode_attention(q, k_cache, v_cache, grp.kv_index, grp.lens, dim ** -0.5)
    torch.testing.assert_close(direct.view(batch, -1), ref, rtol=1e-5, atol=1e-5)
