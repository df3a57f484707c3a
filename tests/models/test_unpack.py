"""Prefill rows on weights unpacked from the int8 codes (``csrc/unpack.cpp``, ``quant.Unpacked``).

Unpacking must give the bits ``PackedWeights.dequantized`` gives (4- and 8-bit codes,
float16 and float32 scales, partial tiles), which for GGUF Q4_1 / Q8_0 sources are the
source weights themselves; so a layer that unpacks for its prefill rows computes what a
layer keeping fp32 copies computes, bit for bit, with no copy kept.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmserve.models import kernels, qlayout
from llmserve.models.quant import Unpacked, WeightOnlyInt8Linear, quantize_groups
from tests.kernel_gate import require_kernels
from tests.models.test_int8 import q4_1_like, q8_0_like

@pytest.fixture(autouse=True)
def _kernels():
    require_kernels()


@pytest.mark.parametrize("n,k,make,bits", [(13, 96, q4_1_like, 4), (72, 64, q8_0_like, 8),
                                           (9, 32, lambda n, k: torch.randn(n, k), 8)])
@pytest.mark.parametrize("fp16", [True, False])
def test_unpacking_gives_the_dequantized_bits(n, k, make, bits, fp16):
    packed = qlayout.pack(*quantize_groups(make(n, k)), fp16=fp16)
    assert packed.bits == bits
    buffer = torch.full((n * k + 5,), float("nan"))  # longer than needed: the view is its start
    got = kernels.load().unpack_weights(packed.codes, packed.scale, packed.offset, n, buffer)
    assert got.shape == (n, k)
    assert torch.equal(got, packed.dequantized())


@pytest.mark.parametrize("make", [q4_1_like, q8_0_like])
def test_gguf_sources_unpack_to_themselves(make):
    w = make(40, 128)
    packed = qlayout.pack(*quantize_groups(w))
    assert torch.equal(kernels.load().unpack_weights(packed.codes, packed.scale, packed.offset, 40, torch.empty(40 * 128)), w)


def test_a_short_buffer_is_refused():
    packed = qlayout.pack(*quantize_groups(q4_1_like(16, 64)))
    with pytest.raises(RuntimeError, match="at least N"):
        kernels.load().unpack_weights(packed.codes, packed.scale, packed.offset, 16, torch.empty(16 * 64 - 1))


@pytest.mark.parametrize("rows", [1, 64, 65, 300])
def test_prefill_rows_of_an_unpacking_layer_equal_those_of_a_layer_keeping_fp32_copies(rows):
    w = q4_1_like(72, 96, seed=rows)
    lean = WeightOnlyInt8Linear.from_float(w, unpacked=Unpacked())
    kept = WeightOnlyInt8Linear.from_float(w, exact=True)
    assert lean.dense is None and kept.dense is not None
    x = torch.randn(rows, 96)
    assert torch.equal(lean(x), kept(x))  # the kernel up to SMALL_M rows in both, fp32 GEMM on w above
    if rows > lean.SMALL_M:
        assert torch.equal(lean(x), F.linear(x, w))


def test_a_layer_larger_than_the_buffer_goes_a_slice_of_outputs_at_a_time(monkeypatch):
    w = q8_0_like(100, 64)  # 13 tiles; 3 a slice below
    monkeypatch.setattr(Unpacked, "LIMIT", 3 * qlayout.TILE * 64)
    unpacked = Unpacked()
    layer = WeightOnlyInt8Linear.from_float(w, unpacked=unpacked)
    x = torch.randn(80, 64)
    torch.testing.assert_close(layer(x), F.linear(x, w), rtol=1e-6, atol=1e-6)
    assert unpacked.buffer.numel() == 3 * qlayout.TILE * 64  # never the whole layer


def test_eight_bit_codes_unpack_from_fewer_rows():
    """The Q8_0 head's kernel is slower per weight than the 4-bit one: its rows go to
    unpack + GEMM above SMALL_M_8BIT, the 4-bit layers' above SMALL_M."""
    w = q8_0_like(48, 64)
    layer = WeightOnlyInt8Linear.from_float(w, unpacked=Unpacked())
    p, m = layer.packed, WeightOnlyInt8Linear.SMALL_M_8BIT
    assert p.bits == 8 and m < WeightOnlyInt8Linear.SMALL_M
    few, more = torch.randn(m, 64), torch.randn(m + 1, 64)
    assert torch.equal(layer(few), layer._product(few, p.codes, p.scale, p.offset, 48, layer.FINE))
    assert torch.equal(layer(more), F.linear(more, w))
    # rescored at one byte (the head's default), the kernel serves up to SMALL_M rows
    layer.FINE, layer.RESCORE = False, 8
    rows = torch.randn(WeightOnlyInt8Linear.SMALL_M, 64)
    one_byte = layer._rescored(rows, layer._product(rows, p.codes, p.scale, p.offset, 48, False))
    assert torch.equal(layer(rows), one_byte)
    over = torch.randn(WeightOnlyInt8Linear.SMALL_M + 1, 64)
    assert torch.equal(layer(over), F.linear(over, w))
