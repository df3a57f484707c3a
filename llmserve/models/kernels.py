"""llmserve's C++ CPU kernels, built once on first use: the int8 product for decode steps
(``csrc/qdot_linear.cpp``: 4- or 8-bit weight codes, activations quantised per 32),
the same codes unpacked to fp32 for prefill GEMM (``csrc/unpack.cpp``), decode attention
over the paged KV pool
(``csrc/paged_attention.cpp``) and the decoder layer's fused small steps
(``csrc/fused_ops.cpp``: RMSNorm with the residual add, RoPE with the KV write, SwiGLU).

torch's own CPU kernels either quantise the activations per tensor (fbgemm's dynamic
int8 linear: too lossy for this model, see the README) or are slow on AVX2-only CPUs
(``_weight_int8pack_mm``: 7-40x slower than fp32 here). The kernels are compiled
with ``torch.utils.cpp_extension`` into torch's extension cache
(``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), so only the first
start on a machine pays the ~1 min build; ``scripts/setup.sh`` does it at install
time. Where they cannot be built, the CPU lacks AVX2/FMA/F16C or :func:`disable` was
called (the CLI does for ``LLMSERVE_NO_KERNELS``), :func:`load` returns None: int8
layers run torch's fp32 product and decode attention gathers its context for SDPA
(correct, slower).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
# bindings.cpp declares every kernel and holds the Python module
SOURCES = ("bindings.cpp", "qdot_linear.cpp", "unpack.cpp", "paged_attention.cpp", "fused_ops.cpp")
HEADERS = ("simd.h",)


def sources() -> tuple[Path, ...]:
    return tuple(CSRC / name for name in SOURCES)


def files() -> tuple[Path, ...]:
    """Everything a build reads: its content names the build."""
    return sources() + tuple(CSRC / name for name in HEADERS)


def cpu_supported() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags and " f16c" in flags


def build_dir() -> Path:
    """A build folder named by the sources' content, holding its own copy of them.

    torch keys a JIT build by name and rebuilds when the command changes, and the
    command names the source's path: two checkouts sharing one cache would rebuild
    (and replace the library under running processes) every time they alternate."""
    import torch

    blob = b"".join(p.read_bytes() for p in files())
    digest = hashlib.sha256(blob + _FLAGS.encode() + torch.__version__.encode()).hexdigest()[:16]
    # torch's own variable, resolved the way torch resolves it for its JIT builds
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    folder = root / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / f"llmserve_kernels_{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# no FMA contraction: the elementwise kernels round like torch's ops (explicit FMAs stay);
# -fopenmp: without it at::parallel_for runs serially (ATen's OpenMP backend is inline),
# with it the library shares the libgomp torch has already loaded
_FLAGS = "-O3 -mavx2 -mfma -mf16c -ffp-contract=off -fopenmp"
_DONE = "llmserve-built"  # written once a build succeeded: the library can be imported as is


_disabled = False


def disable() -> None:
    """Run without the kernels (torch's fp32 products): for comparisons and debugging."""
    global _disabled
    _disabled = True
    load.cache_clear()


@functools.cache
def load():
    """The compiled module (``q4_linear``, ``paged_decode_attention``, ...), or None where it cannot be had."""
    if _disabled or not cpu_supported():
        return None
    try:
        folder = build_dir()
        name = folder.name
        lib = folder / f"{name}.so"
        if (folder / _DONE).is_file() and lib.is_file():
            return _import(name, lib)  # built before: no ninja run, no lock
        for original in files():
            src = folder / original.name
            if not src.is_file() or src.read_bytes() != original.read_bytes():
                shutil.copyfile(original, src)
        copies = [str(folder / src.name) for src in sources()]
        from torch.utils.cpp_extension import load as build

        module = build(name=name, sources=copies, extra_cflags=_FLAGS.split(), extra_ldflags=["-fopenmp"],
                       build_directory=str(folder), verbose=False)
        (folder / _DONE).write_text("ok\n")
        return module
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja...: the fp32 product still works
        log.warning("C++ kernels unavailable (%s); int8 layers use the fp32 product", e)
        return None


def _import(name: str, lib: Path):
    import importlib.util

    import torch  # noqa: F401 - the library links against torch's, which must be loaded first

    spec = importlib.util.spec_from_file_location(name, lib)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":  # python -m llmserve.models.kernels: build it now (set-up does this)
    print("built" if load() is not None else "not available (fallback in use)")
