"""Outlier channels (``llmserve/models/outliers.py``, ``csrc/qdot_linear.cpp``'s Acts): a
layer's few large input channels set aside from one-byte rounding, taken in fp32 on their
weights in float16.

The kernel with channels set aside must equal the kernel on the activations with those
channels zeroed plus their products on the float16 weights (so it neither drops nor double-counts them), on
both code widths, partial tiles and every row count; it must beat plain one-byte rounding
on activations with outliers; the AVX2 and VNNI paths must agree bit for bit; a row's
result must not depend on its batch; and calibration must pick each layer's largest
channels and switch those layers to one byte."""

from __future__ import annotations

import pytest
import torch

from llmserve.models import outliers
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.quant import WeightOnlyInt8Linear, round_activations
from llmserve.models.weights import linear_factory_for
from tests.kernel_gate import require_kernels
from tests.models.test_int8 import kernel_reference, q4_1_like, q8_0_like


@pytest.fixture
def kernel():
    module = require_kernels()
    yield module
    module.int8_vnni(True)


def with_outliers(rows: int, k: int, chans: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[:, chans] *= 40.0  # SmolLM2's inputs run 9-28x their median channel there
    return x


@pytest.mark.parametrize("make", [q4_1_like, q8_0_like], ids=["q4_1", "q8_0"])
@pytest.mark.parametrize("n,k", [(44, 96), (300, 576)])
def test_set_aside_channels_are_taken_exactly_and_the_rest_rounded(kernel, make, n, k):
    w = make(n, k)
    chans = torch.tensor([1, 7, 40, k - 1])
    layer = WeightOnlyInt8Linear.from_float(w)
    layer.FINE = False
    x = with_outliers(13, k, chans)
    plain = layer(x)
    layer.set_outliers(chans)
    got = layer(x)
    held = x.clone()
    held[:, chans] = 0.0
    # (the set-aside channels' weights as the layer keeps them: float16)
    want = kernel_reference(layer, held) + x[:, chans].double() @ layer.dequantized()[:, chans].half().double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    exact = x.double() @ layer.dequantized().double().T
    # the point of it: the other channels' rounding no longer carries the outliers' step
    assert (got.double() - exact).abs().mean() < 0.25 * (plain.double() - exact).abs().mean()
    layer.FINE = True  # two bytes: the channels stay in their groups
    assert torch.equal(layer(x), WeightOnlyInt8Linear.from_float(w)(x))


def test_the_vnni_path_gives_the_avx2_paths_bits_with_channels_set_aside(kernel):
    if not kernel.int8_vnni(True):
        pytest.skip("this CPU has no AVX-512 VNNI: the AVX2 path is the only one")
    for make, n in ((q4_1_like, 52), (q8_0_like, 44)):
        layer = WeightOnlyInt8Linear.from_float(make(n, 576))
        layer.FINE = False
        chans = torch.tensor([0, 31, 32, 300, 575])
        layer.set_outliers(chans)
        x = with_outliers(19, 576, chans, seed=n)
        for rows in (1, 4, 7, 8, 9, 19):
            kernel.int8_vnni(False)
            avx2 = layer(x[:rows])
            assert kernel.int8_vnni(True)
            assert torch.equal(layer(x[:rows]), avx2), rows


def test_a_row_with_channels_set_aside_does_not_depend_on_its_batch(kernel):
    layer = WeightOnlyInt8Linear.from_float(q4_1_like(40, 192))
    layer.FINE = False
    chans = torch.tensor([3, 100, 101])
    layer.set_outliers(chans)
    x = with_outliers(11, 192, chans)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(11)])
    assert torch.equal(layer(x), alone)


def test_bad_channels_are_refused(kernel):
    layer = WeightOnlyInt8Linear.from_float(q4_1_like(8, 64))
    p = layer.packed
    x = torch.randn(2, 64)
    wo = torch.zeros(1, 1, 8, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="chans must lie"):
        kernel.q4_linear(x, p.codes, p.scale, p.offset, 8, False, torch.tensor([64]), wo)
    with pytest.raises(RuntimeError, match="wo must be"):
        kernel.q4_linear(x, p.codes, p.scale, p.offset, 8, False, torch.tensor([1, 2]), wo)


def test_calibration_sets_aside_each_layers_largest_channels():
    require_kernels()
    from tests.engine.conftest import make_tiny

    t = make_tiny(seed=3)
    model = LlamaForCausalLM(t.config, t.weights, linear_factory_for("int8"))
    ids = list(range(3, 60))
    channels = {"qkv": 4, "o": 0, "gate_up": 2, "down": 3}
    absmax = outliers.channel_absmax(model, ids, ["qkv", "gate_up", "down"])
    round_activations(model)
    assert all(getattr(layer, k).outliers is None for layer in model.layers for k in ("qkv", "o", "gate_up", "down"))
    assert outliers.split(model, ids, channels) == 3 * len(model.layers)
    for i, layer in enumerate(model.layers):
        assert layer.o.outliers is None and layer.o.FINE is False  # o: one byte without a split (ONE_BYTE_KINDS)
        for kind in ("qkv", "gate_up", "down"):
            lay = getattr(layer, kind)
            top = set(absmax[(kind, i)].topk(channels[kind]).indices.tolist())
            assert lay.FINE is False and set(lay.outliers[0].tolist()) == top
            assert lay.outliers[0].tolist() == sorted(top)
    # rounding set again: no channel set aside, the kinds that need them back on two bytes
    round_activations(model)
    assert all(layer.qkv.FINE and layer.qkv.outliers is None for layer in model.layers)
    assert outliers.split(model, []) == 0


def test_the_calibration_text_is_not_the_held_out_text():
    import os
    from pathlib import Path

    text = outliers.calibration_text()
    held_out = (Path(os.__file__).parent / "idlelib" / "NEWS2x.txt").read_text()
    assert len(text) > 5_000 and text[:200] not in held_out
