"""Issue 31's serving targets for LoRA through the gateway.

One ``llmserve engine`` (default: the store's SmolLM2-135M-Instruct, LoRA enabled)
and one ``llmserve gateway`` in front of it serving two models on that instance:
``base`` (the base model alone) and ``mixed`` (the base and four adapter versions,
``pool: v1``, equal weights, so anonymous requests spread over the five). Four
random rank-16 PEFT adapters (every projection) are written for the model's
architecture. Each round runs ``llmserve bench`` (its Python API) at concurrency
16 through the gateway against ``base`` and ``mixed``, the order alternating; the
gateway loads the adapters on first use (in the warm-ups). Reported: output
tok/s of each and the ratio mixed / base per round (target >= 0.8).

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

from llmserve.autoscale.providers.process import free_port  # noqa: E402

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


def bench(url: str, model: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from llmserve.bench.cli import execute
    from llmserve.bench.client import EndpointConfig
    from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig

    cfg = BenchConfig(
        endpoint=EndpointConfig(base_url=url, model=model, ignore_eos=True, timeout_s=600),
        dataset=DatasetConfig(name="random", tokenizer=args.tokenizer, random_input_len=args.input_len,
                              random_output_len=args.output_len),
        load=LoadConfig(num_prompts=args.num_prompts, max_concurrency=16, num_warmups=16, seed=seed),
        percentiles=(50.0, 99.0), show_progress=False)
    s = execute(cfg).summary
    if s.failed:
        raise RuntimeError(f"{model}: {s.failed} requests failed: {s.failures_by_kind}")
    return {"output_tok_s": s.output_throughput, "ttft_p50_ms": s.ttft.percentiles_ms["p50"],
            "itl_p50_ms": s.itl.percentiles_ms["p50"], "requests": s.num_requests}


def rss_kib(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1])


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
        for rnd in range(args.rounds):
            order = ("base", "mixed") if rnd % 2 == 0 else ("mixed", "base")
            got = {m: bench(gurl, m, args, seed=rnd) for m in order}
            runs.append({"round": rnd, **{f"{m}_{k}": v for m in got for k, v in got[m].items()},
                         "ratio": got["mixed"]["output_tok_s"] / got["base"]["output_tok_s"]})
            print(f"round {rnd}: base {got['base']['output_tok_s']:.1f} tok/s, mixed "
                  f"{got['mixed']['output_tok_s']:.1f} tok/s, ratio {runs[-1]['ratio']:.3f}", flush=True)
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
    md = [f"# {name}", "", f"`python benchmarks/lora/gateway_streams.py {' '.join(sys.argv[1:])}`  ",
          f"{info['date']}, {info['host_cpus']} CPUs shared with other work, commit {info['git_commit']}", "",
          f"model {model}, engine --threads {args.threads} --max-num-seqs 16 --max-loras 5; 4 rank-16 adapters on "
          f"every projection; {args.num_prompts} prompts {args.input_len} in / {args.output_len} out (ignore_eos, "
          "streaming) at concurrency 16 through `llmserve gateway`; `mixed` spreads them over the base and the "
          "four adapter versions.", "",
          md_table(["round", "base tok/s", "mixed tok/s", "mixed / base", "base TTFT p50 ms", "mixed TTFT p50 ms"],
                   [[r["round"], r["base_output_tok_s"], r["mixed_output_tok_s"], r["ratio"], r["base_ttft_p50_ms"],
                     r["mixed_ttft_p50_ms"]] for r in runs]), "",
          f"Median ratio **{ratio:.3f}** (target >= 0.8).", "",
          f"A fifth rank-16 adapter loaded on the engine: the load call took {load['load_ms']:.0f} ms, "
          f"{load['until_served_ms']:.0f} ms until a one-token completion on it answered (target <= 200 ms); "
          f"adapter files {load['file_bytes'] / 1e6:.2f} MB, engine RSS grew {load['rss_delta_bytes'] / 1e6:.2f} MB.",
          ""]
    (RESULTS / f"{name}.md").write_text("\n".join(md))
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": info, "args": vars(args), "runs": runs,
                                                      "median_ratio": ratio, "load": load}, indent=1))
    print(f"wrote {RESULTS / name}.md")


if __name__ == "__main__":
    main()
