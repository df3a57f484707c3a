"""The kernels' threads claim chunks of work in turn (``csrc/claim.h``) instead of taking a
fixed half each: which thread computes a tile or a head never changes what it computes, so
both ways give the same bits, and every tile or head is computed exactly once (a chunk
skipped would leave ``at::empty``'s garbage; one done twice, the same bits, so the first
check is the one that bites)."""

from __future__ import annotations

import pytest
import torch

from llmserve.models.attention import AttentionMetadata, build_group
from llmserve.models.quant import WeightOnlyInt8Linear
from tests.kernel_gate import require_kernels
from tests.models.test_int8 import kernel_reference, q4_1_like, q8_0_like


@pytest.fixture
def module():
    module = require_kernels()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))  # a fixed split needs two threads to differ from one
    yield module
    module.work_claiming(True)
    torch.set_num_threads(threads)


def both(module, f):
    assert module.work_claiming(False) is False
    fixed = f()
    assert module.work_claiming(True) is True
    return fixed, f()


@pytest.mark.parametrize("make", [q4_1_like, q8_0_like], ids=["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [8 * 8 * 9 + 3, 8 * 200])  # chunks of odd and even tile counts, a partial tile
def test_claimed_products_are_the_fixed_splits_bits(module, make, n):
    k = 128
    layer = WeightOnlyInt8Linear.from_float(make(n, k))
    torch.manual_seed(n)
    x = torch.randn(19, k) * 3
    for vnni in (False, True):
        if vnni and not module.int8_vnni(True):
            continue
        module.int8_vnni(vnni)
        for rows in (1, 4, 19):
            fixed, claimed = both(module, lambda: layer(x[:rows]))
            assert torch.equal(claimed, fixed), (vnni, rows)
    module.int8_vnni(True)
    torch.testing.assert_close(claimed.double(), kernel_reference(layer, x), rtol=1e-4,
                               atol=1e-4 * claimed.abs().max().item())


@pytest.mark.parametrize("batch", [3, 64])
def test_claimed_attention_is_the_fixed_splits_bits(module, batch):
    g = torch.Generator().manual_seed(batch)
    heads, kv_heads, dim, bs, blocks = 9, 3, 64, 4, 2048
    k_cache = torch.randn(blocks * bs, kv_heads, dim, generator=g).half()
    v_cache = torch.randn(blocks * bs, kv_heads, dim, generator=g).half()
    lens = [int(x) for x in torch.randint(1, 120, (batch,), generator=g)]  # uneven: claiming balances them
    order = torch.randperm(blocks, generator=g).tolist()
    tables, used = [], 0
    for n in lens:
        need = -(-n // bs)
        tables.append(order[used:used + need])
        used += need
    slots = torch.tensor([t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)])
    grp = AttentionMetadata(slots, [build_group(0, 1, lens, tables, bs, heads // kv_heads)]).groups[0]
    q = torch.randn(batch, heads, dim, generator=g)
    fixed, claimed = both(module, lambda: module.paged_decode_attention(q, k_cache, v_cache, grp.kv_index,
                                                                         grp.lens, dim ** -0.5))
    assert torch.equal(claimed, fixed)
    # and against plain softmax attention, row by row (no head left uncomputed)
    for b, (t, n) in enumerate(zip(tables, lens)):
        idx = torch.tensor([t[i // bs] * bs + i % bs for i in range(n)])
        kk = k_cache[idx].float().repeat_interleave(heads // kv_heads, dim=1)
        vv = v_cache[idx].float().repeat_interleave(heads // kv_heads, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", q[b], kk) * dim ** -0.5, dim=-1)
        torch.testing.assert_close(claimed.view(batch, heads, dim)[b], torch.einsum("ht,thd->hd", w, vv),
                                   rtol=1e-4, atol=1e-4)
