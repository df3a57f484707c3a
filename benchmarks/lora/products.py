"""The LoRA products alone against the base products they ride on: SmolLM2 int8, 16 rows, 12 of
them over 4 rank-16 adapters (3 each) and 4 on the base, every wrapped product of all 30 layers.

    python benchmarks/lora/products.py [--against 46b64b2] [--reps 30]

``--against COMMIT`` also times ``llmserve/models/lora/slots.py`` as it was at COMMIT (the masked
product over every slot), written with the same adapters, so both run in one process, the reps
interleaved: on a shared machine only such ratios mean anything. Prints the medians of the
per-rep sums (ms) and each as a fraction of the base products.
"""
import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

from llmserve.engine.config import EngineConfig  # noqa: E402
from llmserve.engine.engine import EngineCore  # noqa: E402
from llmserve.models.gguf_loader import GGUFLoader  # noqa: E402


def slots_at(commit: str):
    """The ``slots`` module as it was at ``commit`` (git show), imported under another name."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:llmserve/models/lora/slots.py"],
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"slots_{commit}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    gguf = Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    config, weights = GGUFLoader().load(gguf)
    mods = {f"ad{i}": f"/tmp/llmserve-lora-bench/ad{i}" for i in range(4)}
    eng = EngineCore(EngineConfig(dtype="int8", lora_modules=mods, max_loras=4, threads=a.threads,
                                  speculative_config=None, num_kv_blocks=64), config, weights)
    lora = eng.lora
    row_slots = [s for s in range(4) for _ in range(3)] + [-1] * 4  # the runner's layout: each adapter's rows together
    adapters = [lora.read(n, p) for n, p in mods.items()]
    lora.activate({lora.acquire(f"r{i}", n) for i, n in enumerate(mods)})  # slot i holds ad{i}
    layers = eng.runner.model.layers
    kinds = sorted(lora.slots.stacks[0])
    xs = {k: torch.randn(16, lora.slots.stacks[0][k].a.shape[-1]) for k in kinds}
    ys = {k: torch.zeros(16, getattr(layers[0], k).out_features) for k in kinds}
    impls = {"new": lora.slots}
    if a.against:
        old = slots_at(a.against).LoraSlots(config, 4, 16)
        for slot, ad in enumerate(adapters):
            old.write(slot, ad)
        impls[a.against] = old
    for s in impls.values():
        s.begin_step(row_slots)

    def base() -> None:
        for layer in layers:
            for k in kinds:
                getattr(layer, k).base(xs[k])

    def delta(s) -> None:
        for i in range(len(layers)):
            for k in kinds:
                s.add_delta(ys[k], xs[k], i, k)

    runs = {"base products": base, **{f"LoRA {n}": (lambda s=s: delta(s)) for n, s in impls.items()}}
    times: dict[str, list[float]] = {n: [] for n in runs}
    for rep in range(a.reps + 3):
        for n, f in runs.items():
            t0 = time.perf_counter()
            f()
            if rep >= 3:  # warm-up
                times[n].append(time.perf_counter() - t0)
    b = statistics.median(times["base products"])
    for n, ts in times.items():
        m = statistics.median(ts)
        print(f"{n}: {m * 1e3:.2f} ms (median of {len(ts)}, min {min(ts) * 1e3:.2f}); {m / b:.3f} of the base products")


if __name__ == "__main__":
    main()
