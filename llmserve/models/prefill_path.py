"""Where an int8 model's prefill rows go on this CPU: the int8 kernel or fp32 GEMM on unpacked weights.

Above ``WeightOnlyInt8Linear.SMALL_M`` rows (prefill chunks) either path can run. Which is
faster depends on the CPU's integer throughput, not on the model: on a 2026-12-04 2-core EPYC
with AVX-512 (vpmaddubsw at twice the rate of fp32 FMAs) the kernel took 0.67x the time of
unpack + GEMM over SmolLM2's layers at 512 rows, even on its AVX2 path; on the 2-core EPYC
machines before it (AVX2 only) the kernel's two-byte products ran at 0.4-0.8x torch's fp32
GEMM. So ``--prefill-weights auto`` (the default) times both on the model's first layer
when the engine starts and takes the faster, keeping unpack unless the kernel wins by
``MARGIN`` (a near tie should not flip from one start to the next). The choice is cached per
process, so engines built in one process agree.

The timing is the CPU time of one thread, not wall time: an instance often starts beside
others that are loading or serving, and wall time under that contention says more about the
neighbours than about the CPU (seen: an instance started beside llama-server and another
engine timed the kernel 1.1x slower than unpacking, where alone it is 1.6x faster). One
thread's CPU time counts the instructions' cost alone; both paths scale alike over cores.

The two are not the same numbers: the kernel rounds activations as the layer's decode rows
do (judged by ``benchmarks/activation_quality.py``, which runs the kernel on every row),
the GEMM multiplies fp32 activations by the weights the codes hold.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

ROWS = 256  # a prefill chunk's rows: both paths scale linearly from ~128
REPS = 3
MARGIN = 1.1  # the kernel must be this much faster to be chosen

_cache: dict[tuple, "Timing"] = {}


@dataclass(frozen=True)
class Timing:
    """The least of ``REPS`` timings (one thread's CPU seconds) of the first layer's products
    on ``ROWS`` rows, each way."""

    kernel_s: float
    unpack_s: float

    @property
    def choice(self) -> str:
        """``int8`` (the kernel) or ``unpack``."""
        return "int8" if self.kernel_s * MARGIN < self.unpack_s else "unpack"


def _layers(model) -> list:
    from llmserve.models.quant import WeightOnlyInt8Linear

    first = [kind_layers[0] for kind, kind_layers in model.linears_by_kind().items() if kind != "head"]
    return [layer for layer in first if isinstance(layer, WeightOnlyInt8Linear) and layer.unpacked is not None]


def measure(model) -> Timing | None:
    """Times the kernel against unpack + GEMM on the model's first layer (None: nothing to
    choose, e.g. no int8 layer sends its prefill rows to unpacking)."""
    from llmserve.models import kernels

    layers = _layers(model)
    if not layers:
        return None
    # (not the thread count: the timing runs on one thread whatever the engine's)
    key = (tuple((lay.in_features, lay.out_features, lay.packed.bits, lay.FINE, lay.RESCORE,
                  0 if lay.outliers is None else len(lay.outliers[0])) for lay in layers),
           kernels.load().int8_vnni_active())
    if key not in _cache:
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(ROWS, lay.in_features, generator=gen) for lay in layers]
        buffers = [lay.unpacked for lay in layers]
        best = {"int8": float("inf"), "unpack": float("inf")}
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # every product then runs on this thread: its CPU time is theirs
        try:
            with torch.inference_mode():
                for _ in range(REPS):
                    for path in best:  # each layer's own dispatch, with and without its buffer
                        for lay, buffer in zip(layers, buffers):
                            lay.unpacked = buffer if path == "unpack" else None
                        t = time.thread_time()
                        for lay, x in zip(layers, xs):
                            lay(x)
                        best[path] = min(best[path], time.thread_time() - t)
        finally:
            torch.set_num_threads(threads)
            for lay, buffer in zip(layers, buffers):
                lay.unpacked = buffer
        _cache[key] = Timing(best["int8"], best["unpack"])
    return _cache[key]


def apply(model, choice: str) -> None:
    """Sends every int8 layer's prefill rows to the kernel (``int8``) or leaves them unpacking."""
    from llmserve.models.quant import WeightOnlyInt8Linear

    if choice != "int8":
        return
    for kind_layers in model.linears_by_kind().values():
        for layer in kind_layers:
            if isinstance(layer, WeightOnlyInt8Linear):
                layer.unpacked = None


def choose(model) -> str | None:
    """Measures, logs and applies the faster prefill path; returns it (``unpack`` or ``int8``;
    None where no layer unpacks, so there is nothing to choose)."""
    timing = measure(model)
    if timing is None:
        return None
    log.warning("int8 prefill rows: %s (first layer at %d rows, one thread's CPU time: kernel %.1f ms, "
                "unpack + fp32 GEMM %.1f ms; --prefill-weights pins it)",
                timing.choice, ROWS, 1e3 * timing.kernel_s, 1e3 * timing.unpack_s)
    apply(model, timing.choice)
    return timing.choice
