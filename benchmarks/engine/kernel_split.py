"""Where a steady decode step goes, kernel by kernel, and what is left around them.

    LLMSERVE_NO_VNNI=1 python benchmarks/engine/kernel_split.py            # as an AVX2-only CPU runs
    python benchmarks/engine/kernel_split.py --batches 16,64 --steps 40

Each compiled kernel call (the int8 products, decode attention, the fused small ops) is timed
where the model makes it, and so are the forward pass, the output head and the engine's own
parts of a step (scheduling, sampling, outputs): the forward pass less its kernels is the
Python and torch dispatch of the layers; the head less its product is its rescoring in torch
ops. Speculation is off, so that every step decodes one token a request.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from common import load, steady_core

import llmserve.models.kernels as kernels_module


WHERE = ["step"]  # the timed part of the step a kernel call happens in


def timed(fn, acc: Counter, key: str, part: bool = False):
    """``fn`` adding its wall time to ``acc[key]``; a ``part`` also names where kernels run."""
    def g(*args, **kw):
        outer = WHERE[0]
        if part:
            WHERE[0] = key
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            dt = time.perf_counter() - t
            acc[key] += dt
            WHERE[0] = outer
            if key.startswith("kernel "):
                acc["kernels in " + outer] += dt
    return g


class TimedKernels:
    """The kernels module with every function call adding its wall time to ``acc``."""

    def __init__(self, module, acc: Counter) -> None:
        self._module, self._acc = module, acc

    def __getattr__(self, name: str):
        f = getattr(self._module, name)
        return timed(f, self._acc, "kernel " + name) if callable(f) else f


def measure(loaded, batch: int, steps: int) -> tuple[float, Counter]:
    core = steady_core(loaded, batch, steps, warm=3, speculative_config=None)
    acc: Counter = Counter()
    k = TimedKernels(kernels_module.load(), acc)
    model = core.runner.model
    for layer in [model.lm_head] + [getattr(lay, n) for lay in model.layers for n in ("qkv", "o", "gate_up", "down")]:
        if getattr(layer, "_product", None) is not None:
            layer._product = getattr(k, layer._product.__name__)
    if hasattr(model.ops, "k"):
        model.ops.k = k
    kernels_module.load = lambda *a, **kw: k  # attention looks the kernels up at each call
    for obj, name in ((model, "forward"), (model, "compute_logits"), (core, "_sample"),
                      (core.scheduler, "schedule"), (core.output, "process")):
        setattr(obj, name, timed(getattr(obj, name), acc, name, part=True))
    t = time.perf_counter()
    for _ in range(steps):
        core.step()
    return (time.perf_counter() - t) / steps, acc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    loaded = load()
    original = kernels_module.load
    for batch in (int(b) for b in args.batches.split(",")):
        kernels_module.load = original
        step, acc = measure(loaded, batch, args.steps)
        ms = {key: v / args.steps * 1e3 for key, v in acc.items()}
        print(f"batch {batch}: {step * 1e3:.1f} ms a step")
        for key, v in sorted(ms.items(), key=lambda kv: -kv[1]):
            if not key.startswith("kernels in "):
                print(f"  {key:32s} {v:7.2f} ms")
        for part in ("forward", "compute_logits"):
            print(f"  {part + ' less its kernels':32s} {ms.get(part, 0) - ms.get('kernels in ' + part, 0):7.2f} ms")
    kernels_module.load = original


if __name__ == "__main__":
    main()
