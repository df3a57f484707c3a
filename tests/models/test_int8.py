"""int8 weights (int8 codes, one affine map per 32 weights; fp32 activations) and their kernel.

The kernel is checked against the plain product with the dequantised weights for
many row counts, and the layer's dispatch (kernel up to SMALL_M rows, fp32 GEMM on
the source weights above, fp32 without the kernel); GGUF Q4_1-style weights must
come back exactly; and the model store's int8 cache must give back the same layers
without quantising again.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmserve.models import kernels
from llmserve.models.quant import GROUP, WeightOnlyInt8Linear, quantize_groups
from llmserve.models.weights import PreparedCache, linear_factory_for


def q4_1_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as GGUF Q4_1 stores them: per 32, ``d * q + m`` with q in 0..15 (both ends used)."""
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(n, k // GROUP, 1, generator=g) * 0.02 + 1e-3
    m = torch.randn(n, k // GROUP, 1, generator=g) * 0.05
    q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g)
    q[..., 0], q[..., -1] = 0, 15
    return (d * q + m).reshape(n, k)


def test_the_kernel_builds_on_an_avx2_machine():
    if not kernels.cpu_supported():
        pytest.skip("no AVX2/FMA here: the torch fallback is used")
    assert kernels.load() is not None


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 16, 17, 64])
@pytest.mark.parametrize("n,k", [(40, 32), (100, 96), (300, 576)])
def test_the_product_equals_the_dequantised_one(rows, n, k):
    """The kernel (any row count) against torch on the dequantised weights; the layer
    uses it up to SMALL_M rows and torch's fp32 GEMM on the source weights above."""
    torch.manual_seed(rows * 1000 + n)
    w = torch.randn(n, k)
    layer = WeightOnlyInt8Linear.from_float(w)
    x = torch.randn(rows, k)
    ref = F.linear(x, layer.dequantized())
    tol = dict(rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    if layer._kernel is not None:
        torch.testing.assert_close(layer._kernel.w8_linear(x, layer.q, layer.scale, layer.offset), ref, **tol)
    got = layer(x.reshape(1, rows, k))  # leading dimensions are kept
    assert got.shape == (1, rows, n)
    if rows <= layer.SMALL_M:
        torch.testing.assert_close(got[0], ref, **tol)
    else:
        torch.testing.assert_close(got[0], F.linear(x, w))


def test_without_the_kernel_the_layer_is_the_fp32_product():
    w = torch.randn(64, 128)
    layer = WeightOnlyInt8Linear.from_float(w)
    layer._kernel = None
    x = torch.randn(3, 128)
    torch.testing.assert_close(layer(x), F.linear(x, w))


def q8_0_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as GGUF Q8_0 stores them: per 32, ``d * q`` with q in -127..127 (one end reached)."""
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(n, k // GROUP, 1, generator=g) * 0.001 + 1e-4
    q = torch.randint(-127, 128, (n, k // GROUP, GROUP), generator=g)
    q[..., 0] = 127
    return (d * q).reshape(n, k)


def test_q4_1_and_q8_0_weights_come_back_exactly_and_quantisation_error_is_bounded():
    for w in (q4_1_like(48, 128), q8_0_like(48, 128)):
        layer = WeightOnlyInt8Linear.from_float(w)
        assert (layer.dequantized() - w).abs().max().item() < 1e-6 * w.abs().max().item()
    r = torch.randn(48, 128)
    q, scale, offset = quantize_groups(r)
    assert q.dtype == torch.int8 and scale.shape == offset.shape == (48, 128 // GROUP)
    span = r.reshape(48, -1, GROUP).amax(2) - r.reshape(48, -1, GROUP).amin(2)
    err = (WeightOnlyInt8Linear(q, scale, offset).dequantized() - r).abs().reshape(48, -1, GROUP).amax(2)
    assert bool((err <= span / 255 / 2 * 1.01 + 1e-7).all())  # at most half a step


def test_constant_groups_and_bad_shapes():
    layer = WeightOnlyInt8Linear.from_float(torch.full((8, 32), 0.25))
    torch.testing.assert_close(layer(torch.ones(2, 32)), torch.full((2, 8), 8.0))
    with pytest.raises(ValueError, match="divisible by 32"):
        WeightOnlyInt8Linear.from_float(torch.randn(8, 40))


def test_the_store_cache_gives_back_the_same_layers(tmp_path):
    ws = [torch.randn(64, 96), torch.randn(32, 64)]
    first = linear_factory_for("int8", tmp_path)
    assert isinstance(first, PreparedCache)
    built = [first(w) for w in ws]
    first.save()
    again = linear_factory_for("int8", tmp_path)
    layers = [again(w) for w in ws]
    assert again.hits == 2
    for a, b in zip(built, layers):
        assert torch.equal(a.q, b.q) and torch.equal(a.scale, b.scale) and torch.equal(a.offset, b.offset)
    stale = linear_factory_for("int8", tmp_path)  # a different shape is quantised afresh, not misread
    assert stale(torch.randn(64, 128)).in_features == 128 and stale.hits == 0


def test_the_build_folder_follows_the_source_content(tmp_path, monkeypatch):
    """Builds are keyed by content, so two checkouts sharing a cache never rebuild each other's."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    a = kernels.build_dir()
    copy = tmp_path / "csrc"
    copy.mkdir()
    for src in kernels.files():
        (copy / src.name).write_bytes(src.read_bytes())
    monkeypatch.setattr(kernels, "CSRC", copy)
    assert kernels.build_dir() == a  # same content elsewhere: same folder
    src = copy / "w8_linear.cpp"
    src.write_bytes(src.read_bytes() + b"\n// changed\n")
    assert kernels.build_dir() != a
