"""int8 weights (a code per weight, one affine map per 32) and their decode kernel.

The kernels (4-bit and 8-bit codes, activations quantised per 32 into one or two bytes)
are checked against the float product they define, for 1..16 rows and shapes with odd
group counts and partial tiles; the packing must round-trip and hold GGUF Q4_1 / Q8_0 weights exactly;
the layer's dispatch (kernel up to SMALL_M rows, fp32 GEMM on the source weights above,
fp32 without the kernel); and the model store's cache must give back the same layers
without quantising again.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmserve.models import kernels, qlayout
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.quant import GROUP, WeightOnlyInt8Linear, quantize_groups
from llmserve.models.weights import PREPARED_FORMAT, PreparedCache, linear_factory_for
from tests.kernel_gate import require_kernels

@pytest.fixture
def _kernels():
    return require_kernels()


needs_kernel = pytest.mark.usefixtures("_kernels")


def q4_1_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as GGUF Q4_1 stores them: per 32, ``d * q + m`` with q in 0..15 (both ends
    used), d and m float16 values."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, 1, generator=g) * 0.02 + 1e-3).half().float()
    m = (torch.randn(n, k // GROUP, 1, generator=g) * 0.05).half().float()
    q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g)
    q[..., 0], q[..., -1] = 0, 15
    return (d * q + m).reshape(n, k)


def q8_0_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as GGUF Q8_0 stores them: per 32, ``d * q`` with q in -127..127 (one end
    reached), d a float16 value."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, 1, generator=g) * 0.001 + 1e-4).half().float()
    q = torch.randint(-127, 128, (n, k // GROUP, GROUP), generator=g)
    q[..., 0] = 127
    return (d * q).reshape(n, k)


def kernel_reference(layer: WeightOnlyInt8Linear, x: torch.Tensor) -> torch.Tensor:
    """The product the kernel defines: the weights' centred codes part x dequantised
    activations, plus their offsets x the activations' exact group sums (4-bit codes j
    are centred as j - 7.5, the offset moving by 7.5 steps; 8-bit ones are centred; one-byte
    activations on 8-bit codes at ``ACT_BITS``)."""
    bits = layer.ACT_BITS if layer.packed.bits == 8 and not layer.FINE else 8
    xq, xres, xd, xs = kernels.load().quantize_activations(x, layer.FINE, bits)
    rows, k = x.shape
    xr = ((xq.float() + xres.float() / 128).reshape(rows, -1, GROUP) * xd[..., None]).reshape(rows, k)
    n, p = layer.out_features, layer.packed
    center = 7.5 if p.bits == 4 else 0.0
    offset = qlayout.untile(p.offset.float(), n) + center * qlayout.untile(p.scale.float(), n)
    w_codes = layer.dequantized() - offset.repeat_interleave(GROUP, dim=1)
    return xr.double() @ w_codes.double().T + xs.double() @ offset.double().T


def test_the_kernel_builds_on_an_avx2_machine():
    if not kernels.cpu_supported():
        pytest.skip("no AVX2/FMA/F16C here: the torch fallback is used")
    assert kernels.load() is not None


@needs_kernel
def test_activations_are_quantised_per_32_with_exact_sums():
    torch.manual_seed(0)
    x = torch.randn(5, 160) * torch.logspace(-3, 2, 160)  # outlier-like channels
    x[1, :32] = 0  # an all-zero group
    q, r, xd, xs = kernels.load().quantize_activations(x, False)
    g = x.reshape(5, -1, GROUP)
    torch.testing.assert_close(xd, g.abs().amax(2) / 127)
    torch.testing.assert_close(xs, g.sum(2), rtol=1e-5, atol=1e-4)
    want = torch.round(g / xd.clamp(min=1e-30)[..., None]).clamp(-127, 127)
    diff = (q.float().reshape(5, -1, GROUP) - want).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01  # ties may round either way
    assert q.abs().max() <= 127 and bool((q[1, :32] == 0).all()) and bool((r == 0).all())
    # fine: the residual's byte takes the error from half a step of xd to half of xd / 128
    q2, r2, xd2, _ = kernels.load().quantize_activations(x, True)
    assert torch.equal(q2, q) and torch.equal(xd2, xd) and r2.abs().max() <= 64
    err = (x.reshape(5, -1, GROUP) - (q2.float() + r2.float() / 128).reshape(5, -1, GROUP) * xd[..., None]).abs()
    assert bool((err <= xd[..., None] / 256 * 1.01 + 1e-6).all())
    # seven bits: |q| <= 63 on steps of absmax / 63, both ends reached
    q7, r7, xd7, xs7 = kernels.load().quantize_activations(x, False, 7)
    torch.testing.assert_close(xd7, g.abs().amax(2) / 63)
    assert torch.equal(xs7, xs) and q7.abs().max() == 63 and bool((r7 == 0).all())
    err7 = (g - q7.float().reshape(5, -1, GROUP) * xd7[..., None]).abs()
    assert bool((err7 <= xd7[..., None] / 2 * 1.01 + 1e-6).all())
    with pytest.raises(RuntimeError, match="bits"):
        kernels.load().quantize_activations(x, True, 7)  # two bytes have no seven-bit form


@needs_kernel
@pytest.mark.parametrize("source", ["q4_1", "q8_0", "random"])
@pytest.mark.parametrize("n,k", [(40, 32), (13, 96), (100, 160), (300, 576), (24, 1536)])
def test_the_kernel_equals_its_float_definition(source, n, k):
    """1..16 rows; K = 32 * an odd or even number of groups, not only multiples of 256;
    N not a multiple of the 8-output tile."""
    w = {"q4_1": q4_1_like, "q8_0": q8_0_like, "random": lambda n, k: torch.randn(n, k)}[source](n, k)
    layer = WeightOnlyInt8Linear.from_float(w)
    assert layer.packed.bits == (4 if source == "q4_1" else 8)
    for fine, bits in ((True, 8), (False, 8), (False, 7)):  # (7: 8-bit codes only; 4-bit ones ignore it)
        layer.FINE, layer.ACT_BITS = fine, bits
        for rows in range(1, 17):
            torch.manual_seed(rows)
            x = torch.randn(rows, k) * 3
            ref = kernel_reference(layer, x)
            got = layer(x)
            torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
            if fine:  # 15-bit activations: close to the exact product
                exact = F.linear(x, layer.dequantized())
                torch.testing.assert_close(got, exact, rtol=0, atol=1e-3 * exact.abs().max().item())


@needs_kernel
def test_extreme_codes_and_activations_do_not_saturate():
    """The int16 sums inside the kernel at their bounds: 4-bit codes 15 (and 0) times +-127
    over a whole group; 8-bit codes -128 times -127 (maddubs' largest pair, 32512); at seven
    bits the codes shifted to 0..255 times +-63 (2 * 255 * 63 = 32130)."""
    k = 256
    x = torch.full((3, k), 2.0)
    x[1] = -2.0
    x[2, ::2] = -2.0
    q4 = torch.full((16, k), 1.5)
    q4[:, ::GROUP] = 0.0  # codes 15 but one 0 per group: on the 16-level grid
    q8 = torch.full((16, k), -1.0)
    q8[:, 0] = 1.0 - 2.0 / 255  # min-max grid: codes -128 (most), -127 and 127: off the 16 levels
    q8[:, 1] = -1.0 + 2.0 / 255
    # the shifted codes' end: code 127 (255 shifted) on both of a pair, times q = 63 (seven bits)
    q8hi = torch.full((16, k), 1.0)
    q8hi[:, ::GROUP] = -1.0
    q8hi[:, 1::GROUP] = -1.0 + 2.0 / 255  # (off the 16 levels: 8-bit codes)
    for w, bits in ((q4, 4), (q8, 8), (q8hi, 8)):
        layer = WeightOnlyInt8Linear.from_float(w)
        assert layer.packed.bits == bits
        for fine, act_bits in ((True, 8), (False, 8), (False, 7)):
            layer.FINE, layer.ACT_BITS = fine, act_bits
            torch.testing.assert_close(layer(x).double(), kernel_reference(layer, x), rtol=1e-5, atol=1e-3)
            torch.testing.assert_close(layer(x), F.linear(x, w), rtol=1e-4, atol=1e-2)


def test_packing_round_trips_and_picks_bits_and_scale_precision():
    g = torch.Generator().manual_seed(0)
    for n, k in ((8, 32), (13, 96), (30, 160)):
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        scale, offset = torch.rand(n, k // GROUP, generator=g) + 0.1, torch.randn(n, k // GROUP, generator=g)
        p = qlayout.pack(q, scale, offset)
        assert p.bits == 8 and p.scale.dtype == torch.float32  # arbitrary fp32 scales stay fp32
        want = (q.float().reshape(n, -1, GROUP) * scale[..., None] + offset[..., None]).reshape(n, k)
        torch.testing.assert_close(p.dequantized(), want)
        assert p.codes.shape == (-(-n // 8), k * 8) and p.scale.shape == (-(-n // 8), k // GROUP, 8)
        j = torch.randint(0, 16, (n, k), generator=g)
        p4 = qlayout.pack((17 * j - 128).to(torch.int8), scale, offset)
        assert p4.bits == 4 and p4.codes.dtype == torch.uint8 and p4.codes.shape == (-(-n // 8), k * 4)
        torch.testing.assert_close(p4.dequantized(), (((17 * j - 128).float()).reshape(n, -1, GROUP)
                                                      * scale[..., None] + offset[..., None]).reshape(n, k))
        back = qlayout.PackedWeights.from_tensors(p4.tensors(), (n, k))
        assert back is not None and torch.equal(back.dequantized(), p4.dequantized())
        assert qlayout.PackedWeights.from_tensors(p4.tensors(), (n, k + 32)) is None


def test_q4_1_and_q8_0_weights_come_back_exactly_in_4_and_8_bits_with_fp16_scales():
    for w, bits in ((q4_1_like(48, 160), 4), (q8_0_like(48, 160), 8)):
        layer = WeightOnlyInt8Linear.from_float(w)
        assert layer.packed.bits == bits and layer.packed.scale.dtype == torch.float16
        assert (layer.dequantized() - w).abs().max().item() < 1e-6 * w.abs().max().item()
    r = torch.randn(48, 128)
    q, scale, offset = quantize_groups(r)
    assert q.dtype == torch.int8 and scale.shape == offset.shape == (48, 128 // GROUP)
    span = r.reshape(48, -1, GROUP).amax(2) - r.reshape(48, -1, GROUP).amin(2)
    layer = WeightOnlyInt8Linear.from_float(r)
    assert layer.packed.scale.dtype == torch.float32
    err = (layer.dequantized() - r).abs().reshape(48, -1, GROUP).amax(2)
    assert bool((err <= span / 255 / 2 * 1.01 + 1e-7).all())  # at most half a step


def test_a_16_level_group_stays_on_the_min_max_grid():
    """Values the symmetric grid also holds (here +-7.5 steps) must not make a Q4 group
    symmetric, or the whole matrix would lose its 4-bit form."""
    w = q4_1_like(8, 64)
    w[3, :32] = torch.where(torch.arange(32) % 2 == 0, -0.375, 0.375)  # levels 0 and 15 of d = 0.05
    assert WeightOnlyInt8Linear.from_float(w).packed.bits == 4


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 16, 64, 65, 200])
def test_dispatch_kernel_on_every_row_or_up_to_small_m_then_fp32_source_weights(rows, exact):
    torch.manual_seed(rows)
    w = q4_1_like(72, 96)
    layer = WeightOnlyInt8Linear.from_float(w, exact=exact)
    assert (layer.dense is not None) == (exact or layer._product is None)  # no fp32 copy unless needed
    x = torch.randn(rows, 96)
    got = layer(x.reshape(1, rows, 96))  # leading dimensions are kept
    assert got.shape == (1, rows, 72)
    assert torch.equal(layer(x), got[0])  # the flat [rows, features] call: the same values
    assert torch.equal(layer(x.half()), layer(x.half().float()))  # other dtypes go in as float32
    if layer._product is not None and (rows <= layer.SMALL_M or not exact):
        torch.testing.assert_close(got[0].double(), kernel_reference(layer, x), rtol=1e-4, atol=1e-4)
        exact = F.linear(x, w)  # activation rounding only
        torch.testing.assert_close(got[0], exact, rtol=0, atol=1e-3 * exact.abs().max().item())
    else:
        torch.testing.assert_close(got[0], F.linear(x, w))


@needs_kernel
def test_a_row_of_the_kernel_does_not_depend_on_the_rows_beside_it():
    """Each row is rounded and summed alone: a prompt's rows give the same results in a
    512-row prefill chunk as one at a time (prefix caching and chunking stay consistent)."""
    layer = WeightOnlyInt8Linear.from_float(q4_1_like(40, 128))
    x = torch.randn(300, 128)
    for fine in (True, False):
        layer.FINE = fine
        alone = torch.cat([layer(x[i:i + 1]) for i in (0, 1, 150, 299)])
        assert torch.equal(layer(x)[[0, 1, 150, 299]], alone)


@pytest.mark.parametrize("n", [500, 512, 49152])
def test_the_largest_values_are_those_topk_finds(n):
    from llmserve.models.quant import largest

    torch.manual_seed(n)
    y = torch.randn(5, n)
    y[1, :] = 0.0  # ties: any k of them
    y[2, n // 3] = float("inf")
    got = largest(y, 8)
    assert got.shape == (5, 8) and all(len(set(r)) == 8 for r in got.tolist())
    torch.testing.assert_close(y.gather(1, got).sort(1).values, y.topk(8, dim=1).values.sort(1).values)


@needs_kernel
@pytest.mark.parametrize("make", [q8_0_like, q4_1_like])
def test_a_rescored_one_byte_product_has_its_top_outputs_exact(make):
    """The head's one-byte product with each row's top outputs recomputed: those equal the
    product of fp32 activations with the same weights, so the argmax is the exact one; under
    RESCORE_MIN_ROWS rows it is the two-byte product."""
    from llmserve.models.quant import largest

    torch.manual_seed(7)
    layer = WeightOnlyInt8Linear.from_float(make(512, 128))
    x = torch.randn(16, 128) * torch.linspace(0.05, 3, 128)  # uneven channels: one byte rounds them coarsely
    exact = F.linear(x, layer.dequantized())
    layer.FINE, layer.RESCORE = False, 0
    plain = layer(x)  # one byte, nothing recomputed
    top = largest(plain, 8)
    assert not torch.allclose(plain.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-5)
    layer.RESCORE = 8
    y = layer(x)
    torch.testing.assert_close(y.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-5)
    assert torch.equal(y.scatter(1, top, 0), plain.scatter(1, top, 0))  # the rest is the one-byte product
    assert torch.equal(y.argmax(1), exact.argmax(1))
    few = x[:layer.RESCORE_MIN_ROWS - 1]
    layer.FINE = True
    two = layer(few)
    layer.FINE = False
    assert torch.equal(layer(few), two)


@pytest.mark.parametrize("n,k,make", [(13, 96, q4_1_like), (40, 64, q8_0_like),
                                      (8, 32, lambda n, k: torch.randn(n, k))])
@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_rows_are_those_of_the_dequantized_weights(n, k, make, path, monkeypatch):
    if path == "kernel":
        require_kernels()
    else:
        monkeypatch.setattr(kernels, "load", lambda: None)
    packed = qlayout.pack(*quantize_groups(make(n, k)))
    index = torch.tensor([0, n - 1, 5, 5, 7 % n])
    assert torch.equal(packed.rows(index), packed.dequantized()[index])
    if path == "kernel":
        with pytest.raises(RuntimeError, match="out of range"):
            packed.rows(torch.tensor([n]))


def test_a_tied_int8_head_serves_the_embedding_without_an_fp32_copy():
    from llmserve.models.llama import LINEAR_KINDS
    from llmserve.models.quant import ONE_BYTE_KINDS, RESCORED_KINDS, SEVEN_BIT_KINDS, round_activations
    from tests.engine.conftest import make_tiny

    t = make_tiny(seed=1, tie=True)
    ids = torch.tensor([3, 9, 3, 60])
    ref = t.weights["model.embed_tokens.weight"].float()[ids]
    for exact in (False, True):
        model = LlamaForCausalLM(t.config, t.weights, linear_factory_for("int8", exact=exact))
        assert model.embed is None  # one copy: the head's (its fp32 weights in exact mode, else its codes)
        assert (model.lm_head.dense is None) != exact
        assert torch.equal(model._rows(ids), ref if exact else model.lm_head.dequantized()[ids])
    round_activations(model)
    kinds = model.linears_by_kind()
    assert set(kinds) == set(LINEAR_KINDS)
    assert all(layer.FINE == (kind not in ONE_BYTE_KINDS) for kind, ls in kinds.items() for layer in ls)
    assert all(layer.RESCORE == RESCORED_KINDS.get(kind, 0) for kind, ls in kinds.items() for layer in ls)
    assert all(layer.ACT_BITS == (7 if kind in SEVEN_BIT_KINDS and layer.packed.bits == 8 else 8)
               for kind, ls in kinds.items() for layer in ls)
    assert model.lm_head.ACT_BITS == 7 or model.lm_head.packed.bits == 4


def test_without_the_kernel_the_layer_is_the_fp32_product(monkeypatch):
    monkeypatch.setattr(kernels, "load", lambda: None)  # as with LLMSERVE_NO_KERNELS=1
    w = torch.randn(64, 128)
    layer = WeightOnlyInt8Linear.from_float(w)
    assert layer._product is None
    x = torch.randn(3, 128)
    torch.testing.assert_close(layer(x), F.linear(x, w))


def test_constant_groups_and_bad_shapes():
    layer = WeightOnlyInt8Linear.from_float(torch.full((8, 32), 0.25))
    torch.testing.assert_close(layer(torch.ones(2, 32)), torch.full((2, 8), 8.0))
    with pytest.raises(ValueError, match="divisible by 32"):
        WeightOnlyInt8Linear.from_float(torch.randn(8, 40))


def test_the_store_cache_gives_back_the_same_layers(tmp_path):
    ws = [q4_1_like(64, 96), torch.randn(30, 64), q8_0_like(16, 160)]
    first = linear_factory_for("int8", tmp_path)
    assert isinstance(first, PreparedCache) and first.path == tmp_path / "int8" / f"v{PREPARED_FORMAT}.safetensors"
    built = [first(w) for w in ws]
    first.save()
    again = linear_factory_for("int8", tmp_path)
    layers = [again(w) for w in ws]
    assert again.hits == 3
    for a, b in zip(built, layers):
        for name, t in a.packed.tensors().items():
            assert torch.equal(t, b.packed.tensors()[name]) and t.dtype == b.packed.tensors()[name].dtype
        assert b.out_features == a.out_features and b.in_features == a.in_features
    stale = linear_factory_for("int8", tmp_path)  # a different shape is quantised afresh, not misread
    assert stale(torch.randn(64, 128)).in_features == 128 and stale.hits == 0


def test_a_cache_of_another_format_is_ignored(tmp_path):
    from safetensors.torch import save_file

    w = torch.randn(16, 64)
    layer = WeightOnlyInt8Linear.from_float(w)
    tensors = {f"0.{name}": t for name, t in layer.packed.tensors().items()}
    cache = linear_factory_for("int8", tmp_path)
    cache.path.parent.mkdir()
    save_file(tensors, str(cache.path), metadata={"version": "other"})
    cache = linear_factory_for("int8", tmp_path)
    cache(w)
    assert cache.hits == 0


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
    src = copy / "qdot_linear.cpp"
    src.write_bytes(src.read_bytes() + b"\n// changed\n")
    assert kernels.build_dir() != a
