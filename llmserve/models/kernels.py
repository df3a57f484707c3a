"""llmserve's C++ CPU kernels, built once on first use: the int8 product for decode steps
(``csrc/qdot_linear.cpp``: 4- or 8-bit weight codes, activations quantised per 32; on
CPUs with AVX-512 VNNI ``csrc/qdot_vnni.cpp``, the same bits with up to 8 rows per
weight read, for speculative decoding's verification steps),
the same codes unpacked to fp32 for prefill GEMM (``csrc/unpack.cpp``), decode attention
over the paged KV pool
(``csrc/paged_attention.cpp``) and the decoder layer's fused small steps
(``csrc/fused_ops.cpp``: RMSNorm with the residual add, RoPE with the KV write, SwiGLU)
and LoRA's gathered low-rank products (``csrc/lora_sgmv.cpp``).

torch's own CPU kernels either quantise the activations per tensor (fbgemm's dynamic
int8 linear: too lossy for this model, see the README) or are slow on AVX2-only CPUs
(``_weight_int8pack_mm``: 7-40x slower than fp32 here).

The kernels are built when the package is installed (``setup.py``: a
``torch.utils.cpp_extension`` extension, ``llmserve.models._kernels``), with the
digest of the sources they came from beside them. :func:`load` imports that build;
where there is none, or it was built from other sources (a checkout whose ``csrc``
changed since ``pip install``), it says so in a log line and builds them once with
``torch.utils.cpp_extension.load`` into torch's extension cache
(``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``): about a minute on
two cores. Where they cannot be had at all, the CPU lacks AVX2/FMA/F16C or
:func:`disable` was called (the CLI does for ``LLMSERVE_NO_KERNELS``), :func:`load`
returns None: int8 layers run torch's fp32 product and decode attention gathers its
context for SDPA (correct, slower).
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
SOURCES = ("bindings.cpp", "qdot_linear.cpp", "qdot_vnni.cpp", "unpack.cpp", "paged_attention.cpp", "fused_ops.cpp",
           "lora_sgmv.cpp")
HEADERS = ("simd.h", "qdot_rows.h", "qdot_acts.h")


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


# no FMA contraction: the elementwise kernels round like torch's ops (explicit FMAs stay);
# -fopenmp: without it at::parallel_for runs serially (ATen's OpenMP backend is inline),
# with it the library shares the libgomp torch has already loaded
FLAGS = "-O3 -mavx2 -mfma -mf16c -ffp-contract=off -fopenmp"
PACKAGED = "llmserve.models._kernels"  # the extension setup.py builds; it names its digest()
_DONE = "llmserve-built"  # written once a run-time build succeeded: the library can be imported as is


def digest() -> str:
    """Names a build: the sources, the flags and torch's version."""
    import torch

    blob = b"".join(p.read_bytes() for p in files())
    return hashlib.sha256(blob + FLAGS.encode() + torch.__version__.encode()).hexdigest()[:16]


def build_dir() -> Path:
    """A run-time build folder named by the sources' content, holding its own copy of them.

    torch keys a JIT build by name and rebuilds when the command changes, and the
    command names the source's path: two checkouts sharing one cache would rebuild
    (and replace the library under running processes) every time they alternate."""
    # torch's own variable, resolved the way torch resolves it for its JIT builds
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    folder = root / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / f"llmserve_kernels_{digest()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def packaged() -> tuple[object | None, str]:
    """The install-time build if it was built from these sources, and if not, why."""
    import importlib
    import importlib.util

    import torch  # noqa: F401 - the library links against torch's, which must be loaded first

    if importlib.util.find_spec(PACKAGED) is None:
        return None, "the package was installed without them"
    try:
        module = importlib.import_module(PACKAGED)
    except ImportError as e:
        return None, f"the installed build does not load ({e})"
    if getattr(module, "sources_digest", "") != f"d{digest()}":
        return None, f"the installed build is of other sources than {CSRC}"
    return module, ""


_disabled = False


def disable() -> None:
    """Run without the kernels (torch's fp32 products): for comparisons and debugging."""
    global _disabled
    _disabled = True
    load.cache_clear()


@functools.cache
def load():
    """The compiled module (``q4_linear``, ``paged_decode_attention``, ...), or None where it cannot be had.
    ``LLMSERVE_NO_VNNI`` set: the AVX2 int8 path even where the CPU has AVX-512 VNNI (the same
    bits; for comparisons with an AVX2-only peer build, or as an AVX2-only machine runs)."""
    module = _load()
    if module is not None and os.environ.get("LLMSERVE_NO_VNNI"):
        module.int8_vnni(False)
    return module


def _load():
    if _disabled or not cpu_supported():
        return None
    try:
        module, why = packaged()
        if module is not None:
            return module
        folder = build_dir()
        name = folder.name
        lib = folder / f"{name}.so"
        if (folder / _DONE).is_file() and lib.is_file():
            return _import(name, lib)  # built at run time before: no ninja run, no lock
        log.warning("C++ kernels: %s; building them now into %s (about a minute on two cores; "
                    "`pip install -e . --no-build-isolation` builds them at install time)", why, folder)
        for original in files():
            src = folder / original.name
            if not src.is_file() or src.read_bytes() != original.read_bytes():
                shutil.copyfile(original, src)
        copies = [str(folder / src.name) for src in sources()]
        from torch.utils.cpp_extension import load as build

        module = build(name=name, sources=copies, extra_cflags=FLAGS.split(), extra_ldflags=["-fopenmp"],
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


def origin() -> str:
    """Where :func:`load`'s module came from: for the set-up's check and the logs."""
    module = load()
    if module is None:
        return "not available (fallback in use)"
    return "installed build" if module.__name__ == PACKAGED else f"run-time build in {build_dir()}"


if __name__ == "__main__":  # python -m llmserve.models.kernels: which build is in use (builds one if none)
    print(origin())
