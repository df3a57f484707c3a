"""Issue 31's serving targets for LoRA through the gateway.

One ``llmserve engine`` (default: the store's SmolLM2-135M-Instruct, LoRA enabled)
and one ``llmserve gateway`` in front of it serving two models on that instance:
``base`` (the base model alone) and ``mixed`` (the base and four adapter versions,
``pool: v1``, equal weights, so anonymous requests spread over the five). Four
random rank-16 PEFT adapters (every projection) are written for the model's
architecture. Each round runs 16 closed-loop streams (completions, ``ignore_eos``)
through the gateway against ``base`` and ``mixed``, and the same two mixes against
the engine directly (which says what is the engine's and what the gateway's), the
order alternating; the gateway loads the adapters on first use (in the warm-ups).
Reported: output tok/s of each and the ratio mixed / base per round (target >= 0.8).

Then the adapter load: a fifth rank-16 adapter loaded directly on the engine
(``POST /v1/load_lora_adapter``), timed until the call returns and until a one-token
completion on it has answered (target <= 200 ms until it serves), and the engine's
resident memory before and after (``/proc``; target: about the adapter file size).

    python benchmarks/lora/gateway_streams.py [--model SmolLM2-135M-Instruct | --tiny]
        [--rounds 3] [--num-prompts 64] [--label NAME]

Results: ``benchmarks/results/lora_gateway_streams[-<label>].{md,json}``. Noisy on a
shared machine: compare the ratio within a round, not tok/s across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gateway"))
from overhead import Proc, machine, tiny_model  # noqa: E402 - the gateway benchmark's process helpers
from tables import md_table  # noqa: E402

from llmserve.ports import free_port  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTERS = ("a1", "a2", "a3", "a4")


def hf_config_of(model: str) -> Any:
    """A transformers LlamaConfig with the model's shapes (the adapters are written for them)."""
    from transformers import LlamaConfig

    from llmserve.models.model_source import load_weights
    from llmserve.models.store import resolve

    cfg, _ = load_weights(resolve(model))
    return LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                       num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim or None,
                       tie_word_embeddings=cfg.tie_word_embeddings)


def write_adapters(config: Any, folder: Path, names: tuple[str, ...], rank: int) -> dict[str, Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    out = {}
    base = LlamaForCausalLM(config)  # random weights: only the adapters are saved
    for k, name in enumerate(names):
        torch.manual_seed(k)
        peft = get_peft_model(base, LoraConfig(r=rank, lora_alpha=rank, target_modules=list(TARGETS),
                                               init_lora_weights=False))  # random A and B: not a no-op
        peft.save_pretrained(folder / name)
        base = peft.unload()
        out[name] = folder / name
    return out


def streams(url: str, models: list[str], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """16 closed-loop streams, ``args.num_prompts`` completions in all (``ignore_eos``: every one
    ``args.output_len`` tokens), request ``k`` on ``models[k % len(models)]``; output tokens/s.
    The same client for the gateway and the engine, so the two compare."""
    import asyncio
    import random

    import httpx

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "select", "rows", "from", "where", "join", "table"]
    # Fresh prompts for the warm-up and for every target and round (the caller's seed): a prompt
    # seen before would hit the prefix cache for the base, which the adapters (keyed apart) cannot.
    prompts = [" ".join(rng.choice(words) for _ in range(args.input_len // 2)) for _ in range(args.num_prompts + 16)]
    warm, prompts = prompts[:16], prompts[16:]

    async def run() -> tuple[int, float]:
        queue = list(enumerate(prompts))
        tokens = 0
        async with httpx.AsyncClient(base_url=url, timeout=600, trust_env=False,
                                     limits=httpx.Limits(max_connections=32)) as c:
            async def one(k: int, prompt: str) -> int:
                r = await c.post("/completions", json={"model": models[k % len(models)], "prompt": prompt,
                                                       "max_tokens": args.output_len, "ignore_eos": True})
                r.raise_for_status()
                return r.json()["usage"]["completion_tokens"]

            await asyncio.gather(*(one(k, p) for k, p in enumerate(warm)))  # warm-up: loads, first steps
            t0 = time.perf_counter()

            async def worker() -> None:
                nonlocal tokens
                while queue:
                    k, p = queue.pop()
                    n = await one(k, p)  # (not tokens += await ...: that reads tokens before the wait)
                    tokens += n
            await asyncio.gather(*(worker() for _ in range(16)))
            return tokens, time.perf_counter() - t0
    tokens, elapsed = asyncio.run(run())
    return {"output_tok_s": tokens / elapsed, "tokens": tokens, "seconds": elapsed}


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and its children (the engine's core runs in a child process)."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(line.split()[1]) + sum(rss_kib(int(c)) for c in children)


def load_time(engine_url: str, engine_pid: int, path: Path, served: str) -> dict[str, Any]:
    import httpx

    with httpx.Client(base_url=engine_url, timeout=120, trust_env=False) as c:
        rss0 = rss_kib(engine_pid)
        t0 = time.perf_counter()
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "fresh", "lora_path": str(path)})
        loaded = time.perf_counter() - t0
        r.raise_for_status()
        r = c.post("/v1/completions", json={"model": "fresh", "prompt": "hi", "max_tokens": 1})
        served_s = time.perf_counter() - t0
        r.raise_for_status()
        time.sleep(0.5)
        rss1 = rss_kib(engine_pid)
    size = sum(f.stat().st_size for f in path.iterdir())
    return {"load_ms": 1000 * loaded, "until_served_ms": 1000 * served_s, "file_bytes": size,
            "rss_delta_bytes": 1024 * (rss1 - rss0)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama instead (a quick check of the script)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--label", default="")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    model = str(tiny_model(work)) if args.tiny else args.model
    args.tokenizer = model if args.tiny else None
    paths = write_adapters(hf_config_of(model), work, (*ADAPTERS, "fresh"), rank=16)
    eport, gport = free_port(), free_port()
    engine = Proc("engine", [sys.executable, "-m", "llmserve.cli", "engine", "--model", model, "--port", str(eport),
                             "--served-model-name", "base", "--threads", str(args.threads), "--max-num-seqs", "16",
                             "--enable-lora", "--max-loras", "5", "--max-lora-rank", "16"], work, f"http://127.0.0.1:{eport}/ready")
    eurl = f"http://127.0.0.1:{eport}"
    versions = [{"name": a, "weight": 1, "pool": "v1", "adapter": {"name": a, "path": str(paths[a])}}
                for a in ADAPTERS]
    (work / "gateway.yaml").write_text(json.dumps({"models": [
        {"name": "base", "versions": [{"name": "v1", "weight": 1, "upstreams": [eurl]}]},
        {"name": "mixed", "versions": [{"name": "v1", "weight": 1, "upstreams": [eurl],
                                        "upstream_model": "base"}, *versions]}]}))
    gateway = None
    try:
        engine.wait_ready()
        gateway = Proc("gateway", [sys.executable, "-m", "llmserve.cli", "gateway", "--config",
                                   str(work / "gateway.yaml"), "--port", str(gport)], work,
                       f"http://127.0.0.1:{gport}/ready")
        gateway.wait_ready()
        gurl = f"http://127.0.0.1:{gport}/v1"
        runs = []
        targets = {"base": (gurl, ["base"]), "mixed": (gurl, ["mixed"]),  # the gateway's router spreads "mixed"
                   "base direct": (f"{eurl}/v1", ["base"]), "mixed direct": (f"{eurl}/v1", ["base", *ADAPTERS])}
        for rnd in range(args.rounds):
            order = list(targets) if rnd % 2 == 0 else list(reversed(targets))
            seeds = {t: 100 * rnd + i for i, t in enumerate(targets)}  # fresh prompts for each
            got = {t: streams(*targets[t], args, seed=seeds[t]) for t in order}
            runs.append({"round": rnd, **{t: got[t]["output_tok_s"] for t in targets},
                         "ratio": got["mixed"]["output_tok_s"] / got["base"]["output_tok_s"],
                         "ratio_direct": got["mixed direct"]["output_tok_s"] / got["base direct"]["output_tok_s"]})
            print(f"round {rnd}: " + ", ".join(f"{t} {got[t]['output_tok_s']:.1f} tok/s" for t in targets) +
                  f"; mixed / base {runs[-1]['ratio']:.3f} through the gateway, {runs[-1]['ratio_direct']:.3f} direct",
                  flush=True)
        load = load_time(eurl, engine.pid, paths["fresh"], "base")
        print(f"load: {load}", flush=True)
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()
    write(args, runs, load, model)


def write(args: argparse.Namespace, runs: list[dict], load: dict, model: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine()
    name = "lora_gateway_streams" + (f"-{args.label}" if args.label else "")
    ratio = statistics.median(r["ratio"] for r in runs)
    direct = statistics.median(r["ratio_direct"] for r in runs)
    md = [f"# {name}", "", f"`python benchmarks/lora/gateway_streams.py {' '.join(sys.argv[1:])}`  ",
          f"{info['date']}, {info['host_cpus']} CPUs shared with other work (load average "
          f"{info['loadavg_start'][0]:.1f} at start), commit {info['git_commit']}", "",
          f"model {model}, engine --threads {args.threads} --max-num-seqs 16 --enable-lora --max-loras 5; 4 rank-16 "
          f"adapters on every projection; 16 closed-loop streams, {args.num_prompts} completions of "
          f"{args.output_len} tokens (ignore_eos) after 16 warm-ups. `base`: model `base` through `llmserve "
          "gateway`; `mixed`: model `mixed` through it (the base and four adapter versions on its pool, equal "
          "weights); `direct`: the same mixes sent to the engine itself, round robin over the names.", "",
          md_table(["round", "base tok/s", "mixed tok/s", "mixed / base", "base direct", "mixed direct",
                    "mixed / base direct"],
                   [[r["round"], r["base"], r["mixed"], r["ratio"], r["base direct"], r["mixed direct"],
                     r["ratio_direct"]] for r in runs]), "",
          f"Median mixed / base: **{ratio:.3f}** through the gateway (target >= 0.8), {direct:.3f} direct.", "",
          f"A fifth rank-16 adapter loaded on the engine: the load call took {load['load_ms']:.0f} ms, "
          f"{load['until_served_ms']:.0f} ms until a one-token completion on it answered (target <= 200 ms); "
          f"adapter files {load['file_bytes'] / 1e6:.2f} MB, engine RSS grew {load['rss_delta_bytes'] / 1e6:.2f} MB.",
          ""]
    (RESULTS / f"{name}.md").write_text("\n".join(md))
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": info, "args": vars(args), "runs": runs,
                                                      "median_ratio": ratio, "median_ratio_direct": direct,
                                                      "load": load}, indent=1))
    print(f"wrote {RESULTS / name}.md")


if __name__ == "__main__":
    main()
