"""LoRA on the default model (SmolLM2-135M-Instruct, int8) through HTTP: adapter load time until it
serves, memory per adapter, and 16 streams over 4 adapters + the base against 16 on the base.

    python benchmarks/lora/bench.py [--rounds 2] [--threads 2] [--tokens 64]

Adapters are random rank-16 PEFT folders on all seven modules of every layer (what a full
LoRA fine-tune saves, fp32). One ``llmserve engine --enable-lora --max-loras 4`` serves all runs:

- load: ``POST /v1/load_lora_adapter`` until 200, then the first 1-token completion on the
  adapter (which copies it into a slot) against the same request on the base;
- memory: the engine process's RSS before and after loading the 4 adapters, against their
  file size and a slot's bytes (``LoraSlots.slot_bytes``: the slots are allocated at start);
- throughput: 16 concurrent streams of ``--tokens`` tokens each, all on the base, then 3 on
  each adapter and 4 on the base, alternated ``--rounds`` times; total generated tokens / s.

Writes benchmarks/lora/results.json; README.md holds the recorded figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.engine.memory import status  # noqa: E402
from tests.server.harness import start_engine  # noqa: E402

MODULES = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def write_adapter(folder: Path, config, rank: int, seed: int) -> int:
    """A random PEFT LoRA folder for ``config`` (a ModelConfig); returns the weights file's bytes."""
    from safetensors.torch import save_file

    from llmserve.models.lora.adapter import model_modules

    spots, g = model_modules(config), torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(config.num_hidden_layers):
        for part, mods in MODULES.items():
            for m in mods:
                s = spots[m]
                key = f"base_model.model.model.layers.{i}.{part}.{m}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, s.in_features, generator=g) * 0.02
                tensors[f"{key}.lora_B.weight"] = torch.randn(s.stop - s.start, rank, generator=g) * 0.02
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
        "target_modules": [m for mods in MODULES.values() for m in mods]}))
    return (folder / "adapter_model.safetensors").stat().st_size


def engine_child(pid: int) -> int:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return int(f.read().split()[0])


async def one(client: httpx.AsyncClient, url: str, model: str, i: int, tokens: int) -> int:
    body = {"model": model, "prompt": f"Write a short story about a lighthouse keeper, number {i}.",
            "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    n = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                n += 1
    return n


async def streams(url: str, models: list[str], tokens: int) -> float:
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(client, url, m, i, tokens) for i, m in enumerate(models)))
        return sum(counts) / (time.perf_counter() - t0)


def timed_post(url: str, path: str, body: dict) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = httpx.post(url + path, json=body, timeout=120)
    return (time.perf_counter() - t0) * 1e3, r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tmp", default="/tmp/llmserve-lora-bench")
    a = ap.parse_args()
    from llmserve.models.gguf_loader import GGUFLoader
    from llmserve.models.lora.slots import LoraSlots

    tmp = Path(a.tmp)
    gguf = Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    config = GGUFLoader().read_config(gguf)
    sizes = [write_adapter(tmp / f"ad{i}", config, 16, i) for i in range(5)]
    ep = start_engine("SmolLM2-135M-Instruct", tmp, "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16",
                      "--max-cpu-loras", "8", "--threads", str(a.threads), wait=False)
    ep.wait_ready(timeout=600)
    out: dict = {"threads": a.threads, "tokens_per_stream": a.tokens, "adapter_file_bytes": sizes[0],
                 "slot_bytes": LoraSlots(config, 1, 16).slot_bytes}
    try:
        child = engine_child(ep.proc.pid)
        base = httpx.get(ep.url + "/v1/models").json()["data"][0]["id"]
        one_token = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
        timed_post(ep.url, "/v1/completions", {**one_token, "model": base})
        rss0 = status(child)["VmRSS"]
        loads = []
        for i in range(4):
            ms, r = timed_post(ep.url, "/v1/load_lora_adapter", {"lora_name": f"ad{i}", "lora_path": str(tmp / f"ad{i}")})
            assert r.status_code == 200, r.text
            first, r = timed_post(ep.url, "/v1/completions", {**one_token, "model": f"ad{i}"})
            assert r.status_code == 200, r.text
            base_ms, _ = timed_post(ep.url, "/v1/completions", {**one_token, "model": base})
            loads.append({"load_ms": ms, "first_request_ms": first, "base_request_ms": base_ms})
        out["loads"] = loads
        out["rss_per_loaded_adapter_bytes"] = (status(child)["VmRSS"] - rss0) / 4
        mixed = [f"ad{i}" for i in range(4) for _ in range(3)] + [base] * 4
        runs = {"base": [], "mixed": []}
        asyncio.run(streams(ep.url, [base] * 4, 8))  # warm
        for _ in range(a.rounds):
            runs["base"].append(asyncio.run(streams(ep.url, [base] * 16, a.tokens)))
            runs["mixed"].append(asyncio.run(streams(ep.url, mixed, a.tokens)))
        out["tokens_per_s"] = runs
        out["ratio"] = sum(runs["mixed"]) / sum(runs["base"])
        out["load_report"] = {k: v for k, v in httpx.get(ep.url + "/load").json().items() if k.startswith("lora")}
    finally:
        ep.stop()
    (Path(__file__).parent / "results.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
