"""The kernels split their work over threads (tiles of the int8 products, (sequence, KV
head) pairs of decode attention). Which thread does which part must not change a bit, and
every part must be done exactly once: the output with 1, 2 and 3 threads is the same, on
counts that split unevenly, on both int8 paths. (Threads that claim chunks as they go,
instead of fixed shares, were tried for a thread the API process preempts: no gain
through HTTP or in a contended microbenchmark, `docs/performance.md`.)"""

from __future__ import annotations

import pytest
import torch

from llmserve.models.quant import WeightOnlyInt8Linear
from tests.kernel_gate import require_kernels
from tests.models.test_int8 import kernel_reference, q4_1_like, q8_0_like


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("vnni", [False, True], ids=["avx2", "vnni"])
@pytest.mark.parametrize("make", [q4_1_like, q8_0_like], ids=["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [8, 72, 600, 1000])  # 1, 18, 75 and 125 tiles
def test_the_int8_products_bits_do_not_depend_on_the_threads(threads, vnni, make, n):
    module = require_kernels()
    if vnni and not module.int8_vnni(True):
        pytest.skip("this CPU has no AVX-512 VNNI")
    try:
        module.int8_vnni(vnni)
        layer = WeightOnlyInt8Linear.from_float(make(n, 576))
        x = torch.randn(64, 576, generator=torch.Generator().manual_seed(n)) * 2
        outs = []
        for t in (1, 2, 3):
            threads(t)
            outs.append(layer(x))
        assert all(torch.equal(o, outs[0]) for o in outs[1:])
        # every tile computed (a skipped one would hold whatever empty() gave)
        torch.testing.assert_close(outs[1].double(), kernel_reference(layer, x), rtol=1e-4,
                                   atol=1e-4 * outs[1].abs().max().item())
    finally:
        module.int8_vnni(True)


@pytest.mark.parametrize("batch", [1, 7, 64])  # 3, 21 and 192 pairs
def test_decode_attentions_bits_do_not_depend_on_the_threads(threads, batch):
    module = require_kernels()
    g = torch.Generator().manual_seed(batch)
    kv_heads, heads, dim, bs = 3, 9, 64, 16
    lens = torch.randint(1, 200, (batch,), generator=g)
    width = int(lens.max()) // bs + 1
    blocks = torch.randperm(batch * width, generator=g).view(batch, width)
    index = (blocks[:, :, None] * bs + torch.arange(bs)).view(batch, -1)[:, :int(lens.max())].contiguous()
    k_cache = torch.randn(batch * width * bs, kv_heads, dim, generator=g).half()
    v_cache = torch.randn(batch * width * bs, kv_heads, dim, generator=g).half()
    q = torch.randn(batch, heads, dim, generator=g)
    outs = []
    for t in (1, 2, 3):
        threads(t)
        outs.append(module.paged_decode_attention(q, k_cache, v_cache, index, lens, dim ** -0.5))
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    for b in (0, batch - 1):  # against plain softmax attention, on the first and last sequence
        n = int(lens[b])
        k = k_cache[index[b, :n]].float().repeat_interleave(heads // kv_heads, dim=1)
        v = v_cache[index[b, :n]].float().repeat_interleave(heads // kv_heads, dim=1)
        p = torch.softmax(torch.einsum("hd,thd->ht", q[b], k) * dim ** -0.5, dim=-1)
        torch.testing.assert_close(outs[0][b].view(heads, dim), torch.einsum("ht,thd->hd", p, v),
                                   rtol=1e-4, atol=1e-4)
