"""Engine step time in-process (no HTTP): 16 decode rows on SmolLM2 int8, without LoRA, with LoRA
on the base only, and 12 rows over 4 rank-16 adapters + 4 on the base.

    python benchmarks/lora/steps.py   (after benchmarks/lora/bench.py wrote the adapters)
"""
import sys, time, torch
from pathlib import Path
from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.models.gguf_loader import GGUFLoader
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models import kernels
print("kernels", kernels.load() is not None)
gguf = Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
config, weights = GGUFLoader().load(gguf)
tmp = Path("/tmp/llmserve-lora-bench")
mods = {f"ad{i}": str(tmp / f"ad{i}") for i in range(4)}
sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
for lora in (False, True):
    eng = EngineCore(EngineConfig(dtype="int8", lora_modules=mods if lora else {}, max_loras=4, threads=2, speculative_config=None, num_kv_blocks=256), config, weights)
    for mode in (("base", "mixed") if lora else ("base",)):
        names = [None]*16 if mode == "base" else [f"ad{i%4}" if i < 12 else None for i in range(16)]
        for i, n in enumerate(names):
            eng.add_request(f"{mode}{i}", list(range(10 + i, 40 + i)), sp, lora_name=n)
        steps, t0 = 0, None
        while eng.has_unfinished():
            eng.step(); steps += 1
            if steps == 3: t0 = time.perf_counter()
        print("lora" if lora else "plain", mode, (time.perf_counter() - t0) / (steps - 3) * 1e3, "ms/step", steps, flush=True)
