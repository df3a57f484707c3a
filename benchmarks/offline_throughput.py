"""Offline generation throughput on the real model: llmserve vs Hugging Face static batching.

    python benchmarks/offline_throughput.py                # 64 prompts, 128 in / 128 out, c = 1, 16, 64
    python benchmarks/offline_throughput.py --dtypes fp32,int8   # several weight formats, one run
    python benchmarks/offline_throughput.py --quick        # a smaller smoke run

Reports generated tokens/s at each concurrency and the fraction of the compute
ceiling (2 x parameters FLOPs per token against a GEMM rate measured in the same
run). Writes benchmarks/results/offline_throughput.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def gemm_gflops(threads: int) -> float:
    """fp32 GEMM rate at a decode-batch shape of this model (hidden 576 -> 1536)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(256, 576), torch.randn(576, 1536)
    for _ in range(5):
        a @ b
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < 2.0:
        a @ b
        n += 1
    return 2 * 256 * 576 * 1536 * n / (time.perf_counter() - t) / 1e9


def prompts_for(tok, n: int, length: int, seed: int) -> list[list[int]]:
    text = Path(os.__file__).with_name("LICENSE.txt").read_text()
    ids = tok.encode(text, add_special_tokens=False)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = int(torch.randint(0, len(ids) - length, (1,), generator=g))
        out.append(ids[start:start + length])
    return out


def run_llmserve(llm, prompts, out_len: int, concurrency: int) -> dict:
    from llmserve import SamplingParams

    eng = llm.engine
    eng.scheduler.config.max_num_seqs = concurrency
    sp = SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add_request(f"b{concurrency}-{i}", p, sp)
    gen = 0
    while eng.has_unfinished():
        for o in eng.step():
            gen += len(o.outputs[0].delta_token_ids)
    dt = time.perf_counter() - t0
    return {"tokens": gen, "seconds": dt, "tok_s": gen / dt}


def run_hf(model, prompts, out_len: int, concurrency: int) -> dict:
    gen, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), concurrency):
        batch = torch.tensor(prompts[i:i + concurrency])  # equal lengths: no padding needed
        with torch.no_grad():
            out = model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=out_len,
                                 min_new_tokens=out_len, do_sample=False, pad_token_id=0)
        gen += (out.shape[1] - batch.shape[1]) * batch.shape[0]
    dt = time.perf_counter() - t0
    return {"tokens": gen, "seconds": dt, "tok_s": gen / dt}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtypes", default="fp32", help="comma-separated weight formats, measured in turn")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out-len", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from llmserve import LLM
    from llmserve.models.store import default_store_dir, resolve

    in_len, out_len = (64, 32) if args.quick else (128, args.out_len)
    plan = {1: 2, 16: 16, 64: 64} if not args.quick else {1: 1, 16: 16}
    dtypes = args.dtypes.split(",")
    llms = {d: LLM(args.model, dtype=d, max_num_seqs=64, max_num_batched_tokens=2048, threads=args.threads)
            for d in dtypes}
    tok = llms[dtypes[0]].get_tokenizer()
    n_params = llms[dtypes[0]].engine.runner.model.num_parameters()
    rate = gemm_gflops(args.threads)
    ceiling = rate * 1e9 / (2 * n_params)
    rows = []
    hf = None
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        src = resolve(args.model, default_store_dir())
        hf = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32).eval()
    for c, n in plan.items():
        prompts = prompts_for(tok, n, in_len, seed=c)
        row = {"concurrency": c, "prompts": n}
        for d in dtypes:
            r = run_llmserve(llms[d], prompts, out_len, c)
            row.update({f"{d}_tok_s": r["tok_s"], f"{d}_s": r["seconds"], f"{d}_fp32_ceiling_fraction":
                        r["tok_s"] / ceiling})
        if hf is not None:
            h = run_hf(hf, prompts, out_len, c)
            row.update(hf_tok_s=h["tok_s"], hf_s=h["seconds"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_avg": os.getloadavg(), "threads": args.threads,
            "gemm_gflops": rate, "ceiling_tok_s": ceiling, "in_len": in_len, "out_len": out_len,
            "dtypes": dtypes, "machine": platform.processor() or platform.machine(),
            "command": "python benchmarks/offline_throughput.py " + " ".join(sys.argv[1:])}
    RESULTS.mkdir(exist_ok=True)
    name = "offline_throughput" + ("_quick" if args.quick else "") + ("" if dtypes == ["fp32"] else "_" + "_".join(dtypes))
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    cols = [f"llmserve {d} tok/s" for d in dtypes] + ["HF fp32 tok/s"] + [f"{d}/HF" for d in dtypes]
    lines = [f"`{meta['command']}`", "",
             f"GEMM {rate:.0f} GFLOP/s -> fp32 compute ceiling {ceiling:.0f} tok/s; load avg "
             f"{meta['load_avg'][0]:.1f}; {in_len} in / {out_len} out; {args.threads} threads; {meta['date']}", "",
             "| concurrency | prompts | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in rows:
        hf_t = r.get("hf_tok_s", float("nan"))
        cells = [f"{r[f'{d}_tok_s']:.1f}" for d in dtypes] + [f"{hf_t:.1f}"] + \
            [f"{r[f'{d}_tok_s'] / hf_t:.2f}" for d in dtypes]
        lines.append(f"| {r['concurrency']} | {r['prompts']} | " + " | ".join(cells) + " |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
