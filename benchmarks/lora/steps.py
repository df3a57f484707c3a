"""Engine step time in-process (no HTTP): 16 decode rows on SmolLM2 int8, without LoRA, with LoRA
on the base only, and 12 rows over 4 rank-16 adapters + 4 on the base.

    python benchmarks/lora/steps.py [--rounds 3]   (after benchmarks/lora/bench.py wrote the adapters)

The three mixes alternate round by round (the machine is shared: compare within a run); each
figure is the median decode step of all rounds, after each batch's prefill.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from llmserve.engine.config import EngineConfig  # noqa: E402
from llmserve.engine.engine import EngineCore  # noqa: E402
from llmserve.engine.sampling_params import SamplingParams  # noqa: E402
from llmserve.models import kernels  # noqa: E402
from llmserve.models.gguf_loader import GGUFLoader  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--tokens", type=int, default=10)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
print("kernels", kernels.load() is not None)
gguf = Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
config, weights = GGUFLoader().load(gguf)
tmp = Path("/tmp/llmserve-lora-bench")
mods = {f"ad{i}": str(tmp / f"ad{i}") for i in range(4)}
sp = SamplingParams(max_tokens=a.tokens, temperature=0, ignore_eos=True)
engines = {lora: EngineCore(EngineConfig(dtype="int8", lora_modules=mods if lora else {}, max_loras=4, threads=a.threads,
                                         speculative_config=None, num_kv_blocks=256), config, weights)
           for lora in (False, True)}
mixes = {"no LoRA": (False, [None] * 16), "LoRA, all rows on the base": (True, [None] * 16),
         "LoRA, 12 rows over 4 adapters + 4 base": (True, [f"ad{i % 4}" if i < 12 else None for i in range(16)])}
times: dict[str, list[float]] = {m: [] for m in mixes}
for rnd in range(a.rounds):
    for mode in (list(mixes) if rnd % 2 == 0 else list(reversed(mixes))):
        lora, names = mixes[mode]
        eng = engines[lora]
        for i, n in enumerate(names):
            eng.add_request(f"{rnd}-{mode}-{i}", list(range(10 + i, 40 + i)), sp, lora_name=n)
        eng.step()  # the prefill
        while eng.has_unfinished():
            t0 = time.perf_counter()
            eng.step()
            times[mode].append(time.perf_counter() - t0)
base = statistics.median(times["no LoRA"])
for mode, ts in times.items():
    ms = statistics.median(ts) * 1e3
    print(f"{mode}: {ms:.1f} ms / step (median of {len(ts)}, min {min(ts) * 1e3:.1f}); "
          f"{base * 1e3 / ms:.3f} x the steps/s without LoRA", flush=True)
