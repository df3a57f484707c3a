"""The weight-only int8 kernel (``csrc/w8_linear.cpp``): built once, on first use.

torch's own CPU kernels either quantise the activations too (fbgemm's dynamic int8
linear: too lossy for this model, see the README) or are slow on AVX2-only CPUs
(``_weight_int8pack_mm``: 20-40x slower than fp32 here). The kernel is compiled with
``torch.utils.cpp_extension`` into torch's extension cache (``$TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``), so only the first start on a machine pays
the ~1 min build; ``scripts/setup.sh`` does it at install time. Where it cannot be
built or the CPU lacks AVX2/FMA, :func:`load` returns None and int8 layers run
torch's fp32 product instead (correct, no faster than fp32).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "w8_linear.cpp"


def cpu_supported() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags


@functools.cache
def load():
    """The compiled module (with ``w8_linear``), or None where it cannot be had."""
    if os.environ.get("LLMSERVE_NO_W8_KERNEL") or not cpu_supported():
        return None
    try:
        from torch.utils.cpp_extension import load as build

        return build(name="llmserve_w8", sources=[str(SOURCE)], extra_cflags=["-O3", "-mavx2", "-mfma"],
                     verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja...: the fallback still works
        log.warning("weight-only int8 kernel unavailable (%s); using the slower torch fallback", e)
        return None


if __name__ == "__main__":  # python -m llmserve.models.w8_kernel: build it now (set-up does this)
    print("built" if load() is not None else "not available (fallback in use)")
