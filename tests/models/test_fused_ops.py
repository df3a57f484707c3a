"""The fused C++ forms of the decoder layer's small steps against the torch forms they replace."""

from __future__ import annotations

import pytest
import torch

from llmserve.models.ops import FusedOps, TorchOps
from llmserve.models.rope import RotaryEmbedding
from tests.kernel_gate import require_kernels

REF = TorchOps()


@pytest.fixture(scope="module")
def fused() -> FusedOps:
    return FusedOps(require_kernels())


@pytest.mark.parametrize("rows", [1, 7, 40])
@pytest.mark.parametrize("hidden", [576, 100])
def test_rms_norm_and_the_residual_add(fused, rows, hidden):
    g = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=g) * 3
    r = torch.randn(rows, hidden, generator=g)
    w = torch.randn(hidden, generator=g)
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-5), REF.rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    xa, xb = x.clone(), x.clone()
    ya, yb = fused.add_rms_norm_(xa, r, w, 1e-5), REF.add_rms_norm_(xb, r, w, 1e-5)
    assert torch.equal(xa, xb)  # the residual stream itself is exact
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,inter", [(1, 1536), (9, 1536), (3, 20)])
def test_silu_mul(fused, rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    gu = torch.randn(rows, 2 * inter, generator=g) * 6
    gu[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -88.0])  # the exponent's clamps
    torch.testing.assert_close(fused.silu_mul(gu), REF.silu_mul(gu), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("rows,inter", [(1, 2048), (9, 2048), (3, 20)])
def test_gelu_tanh_mul(fused, rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    gu = torch.randn(rows, 2 * inter, generator=g) * 4
    gu[0, :5] = torch.tensor([-200.0, 200.0, 0.0, -12.0, 1e-4])  # tanh's ends and its middle
    exact = REF.gelu_mul(gu.double(), "tanh")
    got = fused.gelu_mul(gu, "tanh")
    # against float64: torch's fp32 form loses digits in 1 + tanh where the gate is negative
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got, REF.gelu_mul(gu, "tanh"), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.gelu_mul(gu, "none"), REF.gelu_mul(gu, "none"))  # erf's form: torch's


@pytest.mark.parametrize("heads,kv_heads,dim,tokens", [(9, 3, 64, 1), (4, 1, 256, 5), (2, 2, 16, 20)])
def test_qk_norm_in_place(fused, heads, kv_heads, dim, tokens):
    g = torch.Generator().manual_seed(heads * dim + tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g) * 3
    qw, kw = torch.randn(dim, generator=g), torch.randn(dim, generator=g)
    a, b = qkv.clone(), qkv.clone()
    fused.qk_norm_(a, qw, kw, heads, kv_heads, 1e-6)
    REF.qk_norm_(b, qw, kw, heads, kv_heads, 1e-6)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    v = (heads + kv_heads) * dim
    assert torch.equal(a[:, v:], qkv[:, v:]) and not torch.equal(a[:, :v], qkv[:, :v])  # v untouched, q / k normed


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,dim,tokens", [(9, 3, 64, 1), (9, 3, 64, 37), (4, 2, 16, 5), (3, 1, 12, 3)])
def test_rope_and_the_kv_write(fused, heads, kv_heads, dim, tokens, cache_dtype):
    g = torch.Generator().manual_seed(tokens + dim)
    rope = RotaryEmbedding(dim, 4096, 10000.0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g)
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    slots = torch.randperm(256, generator=g)[:tokens]
    caches = [torch.randn(256, kv_heads, dim, generator=g).to(cache_dtype) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    q_ref = REF.rope_and_cache_(qkv.clone(), positions, rope, *ref_caches, slots, heads, kv_heads)
    q = fused.rope_and_cache_(qkv, positions, rope, *caches, slots, heads, kv_heads)
    torch.testing.assert_close(q, q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(caches[0], ref_caches[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(caches[1], ref_caches[1])  # values are copied, not rotated
    if cache_dtype == torch.float16:  # rounded as torch's .to(float16) rounds, tails included
        assert torch.equal(caches[0], ref_caches[0])


def test_bad_indices_are_refused_not_written(fused):
    rope = RotaryEmbedding(16, 64, 10000.0)
    qkv = torch.randn(1, 4 * 16)
    kc, vc = torch.zeros(8, 1, 16), torch.zeros(8, 1, 16)
    with pytest.raises(RuntimeError, match="out of range"):
        fused.rope_and_cache_(qkv, torch.tensor([0]), rope, kc, vc, torch.tensor([8]), 2, 1)
    with pytest.raises(RuntimeError, match="out of range"):
        fused.rope_and_cache_(qkv, torch.tensor([64]), rope, kc, vc, torch.tensor([0]), 2, 1)
    assert not kc.any() and not vc.any()


def test_argmax_takes_the_first_maximum(fused):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 49152, generator=g)
    logits[1, 7] = logits[1, 9000] = 100.0  # a tie: the first wins
    logits[2] = 0.0
    logits[3, 123] = float("nan")
    assert torch.equal(fused.argmax(logits), REF.argmax(logits))
    assert fused.argmax(logits)[1] == 7


@pytest.mark.parametrize("V", [1, 7, 63, 64, 65, 95, 96, 97, 131, 49152, 49153])
def test_argmax_matches_torch_on_ties_infinities_and_nans_anywhere(fused, V):
    """The vector scan keeps 32 lanes and a scalar tail: ties across lanes, between a lane and
    the tail, infinities and NaNs in either part must all come out as torch.argmax's."""
    g = torch.Generator().manual_seed(V)
    rows = [torch.randn(V, generator=g) for _ in range(4)]
    for _ in range(40):
        r = torch.randint(-3, 4, (V,), generator=g).float()  # few values: many ties
        picks = torch.randint(0, V, (3,), generator=g)
        kind = int(torch.randint(0, 6, (1,), generator=g))
        if kind == 1:
            r[picks] = float("inf")
        elif kind == 2:
            r[picks[0]] = float("nan")
        elif kind == 3:
            r[:] = float("-inf")
        elif kind == 4:
            r[picks[1:]] = float("nan")  # two NaNs: the first wins
        elif kind == 5:
            r[-1] = 10.0  # the tail's last holds the maximum
        rows.append(r)
    logits = torch.stack(rows)
    assert torch.equal(fused.argmax(logits), REF.argmax(logits))
