"""The int8 product's AVX-512 VNNI path (``csrc/qdot_vnni.cpp``): up to 8 rows per read of
the weights, for the verification steps of speculative decoding (issue 37). Its integer
sums are exact and its float steps those of the AVX2 path, so both must give the same
bits, for every row count (passes of 8 and their remainders; from 9 rows two tiles a pass
in 512-bit vectors, a lone tile left at a thread's end or a partial last one), both code
widths, one- and two-byte activations (one byte at 8 and 7 bits), float16 and float32 scales and a partial last tile."""

from __future__ import annotations

import os

import pytest
import torch

from llmserve.models.quant import WeightOnlyInt8Linear
from tests.kernel_gate import require_kernels
from tests.models.test_int8 import kernel_reference, q4_1_like, q8_0_like


@pytest.fixture
def vnni():
    module = require_kernels()
    if not module.int8_vnni(True):
        pytest.skip("this CPU has no AVX-512 VNNI: the AVX2 path is the only one")
    yield module
    module.int8_vnni(True)


@pytest.mark.parametrize("make", [q4_1_like, q8_0_like, lambda n, k: torch.randn(n, k) * 0.1],
                         ids=["q4_1", "q8_0", "random"])
@pytest.mark.parametrize("n,k", [(44, 96), (52, 64), (300, 576)])  # 6, 7 (odd: a lone tile) and 38 tiles
def test_the_vnni_path_gives_the_avx2_paths_bits(vnni, make, n, k):
    w = make(n, k)
    torch.manual_seed(n)
    x = torch.randn(19, k) * 3
    x[3, :32] = 0.0  # an all-zero group
    x[5, 32:64] = 1e4  # a large one: the 8-bit codes' shifted bytes at their ends
    for half in (True, False):
        layer = WeightOnlyInt8Linear.from_float(w)
        if not half:
            layer.packed.scale, layer.packed.offset = layer.packed.scale.float(), layer.packed.offset.float()
        for fine, bits in ((True, 8), (False, 8), (False, 7)):  # (seven bits: on 8-bit codes)
            layer.FINE, layer.ACT_BITS = fine, bits
            for rows in (1, 2, 3, 5, 7, 8, 9, 16, 19, 64):
                vnni.int8_vnni(False)
                avx2 = layer(x[:rows])
                assert vnni.int8_vnni(True)
                got = layer(x[:rows])
                assert torch.equal(got, avx2), (half, fine, bits, rows)
            torch.testing.assert_close(got.double(), kernel_reference(layer, x), rtol=1e-4,
                                       atol=1e-4 * got.abs().max().item())



def test_llmserve_no_vnni_keeps_the_avx2_path():
    """``LLMSERVE_NO_VNNI``: the AVX2 path on a VNNI CPU (comparisons with an AVX2-only peer)."""
    import subprocess
    import sys

    from llmserve.models import kernels

    k = kernels.load()
    if k is None or not k.int8_vnni(True):
        pytest.skip("no AVX-512 VNNI on this CPU: there is no other path to keep")

    code = "from llmserve.models import kernels; k = kernels.load(); print(k is not None and k.int8_vnni_active())"
    env = {**os.environ, "LLMSERVE_NO_VNNI": "1"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "False"
    env.pop("LLMSERVE_NO_VNNI")
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert on.stdout.strip() == "True"
