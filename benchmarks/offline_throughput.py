"""Offline generation throughput on the real model: llmserve vs Hugging Face static batching
(and llama.cpp's server, when given one).

    python benchmarks/offline_throughput.py                # 64 prompts, 128 in / 128 out, c = 1, 16, 64
    python benchmarks/offline_throughput.py --dtypes fp32,int8   # several weight formats, one run
    python benchmarks/offline_throughput.py --quick        # a smaller smoke run
    python benchmarks/offline_throughput.py --dtypes int8 --llama-server PATH   # + a llama.cpp column

Reports generated tokens/s at each concurrency and the fraction of the compute
ceiling (2 x parameters FLOPs per token against a GEMM rate measured in the same
run). Writes benchmarks/results/offline_throughput.{md,json}.

llama.cpp is not part of the project; with ``--llama-server PATH`` (or env
LLAMA_SERVER) each concurrency c also starts that llama-server on the same GGUF
file llmserve loads, with c slots and the same thread count, and sends it the same
prompts as token ids. The binary measured so far was built from the llama.cpp
vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    cmake --build build --target llama-server -j2     # -> build/bin/llama-server
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
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


def llama_server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], check=False, capture_output=True, text=True, timeout=30)
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version:")]
    return lines[0].removeprefix("version:").strip() if lines else "?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_llamacpp(binary: str, gguf: Path, prompts, out_len: int, concurrency: int, threads: int) -> dict:
    """llama-server with one slot per concurrent request; ``concurrency`` requests in flight at a
    time, like llmserve's ``max_num_seqs``. Only the requests are timed, not the server's start."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ctx = concurrency * max(320, len(prompts[0]) + out_len)  # -c is shared evenly among the -np slots
    cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(concurrency),
           "-c", str(ctx), "-t", str(threads), "-tb", str(threads), "--cont-batching", "--no-webui"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while True:  # /health answers 503 while the model loads and warms up
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"llama-server did not become healthy: {' '.join(cmd)}\n"
                                       + log.read().decode(errors="replace")[-2000:])
                try:
                    with urllib.request.urlopen(url + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(0.2)

            def one(p: list[int]) -> int:
                # token ids, not text: both engines see the identical prompt whatever their tokenisers do
                body = {"prompt": p, "n_predict": out_len, "ignore_eos": True, "temperature": 0,
                        "cache_prompt": False}
                req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=3600) as r:
                    out = json.load(r)
                if out["tokens_evaluated"] != len(p):  # e.g. a BOS added in front
                    raise RuntimeError(f"llama-server read {out['tokens_evaluated']} prompt tokens, sent {len(p)}")
                return out["tokens_predicted"]

            t0 = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                gen = sum(pool.map(one, prompts))
            dt = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait()
    return {"tokens": gen, "seconds": dt, "tok_s": gen / dt}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtypes", default="fp32", help="comma-separated weight formats, measured in turn")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"),
                    help="llama.cpp's llama-server binary: adds a llama.cpp column (env LLAMA_SERVER)")
    args = ap.parse_args()
    if args.llama_server and not os.access(args.llama_server, os.X_OK):
        ap.error(f"--llama-server {args.llama_server}: not an executable file")
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
    src = resolve(args.model, default_store_dir())  # the GGUF llmserve loaded; HF and llama.cpp read it too
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

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
        if args.llama_server:
            lc = run_llamacpp(args.llama_server, src, prompts, out_len, c, args.threads)
            row.update(llamacpp_tok_s=lc["tok_s"], llamacpp_s=lc["seconds"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_avg": os.getloadavg(), "threads": args.threads,
            "gemm_gflops": rate, "ceiling_tok_s": ceiling, "in_len": in_len, "out_len": out_len,
            "dtypes": dtypes, "machine": platform.processor() or platform.machine(),
            "command": "python benchmarks/offline_throughput.py " + " ".join(sys.argv[1:])}
    if args.llama_server:
        meta.update(llama_server=args.llama_server, llama_server_version=llama_server_version(args.llama_server),
                    gguf=str(src))
    RESULTS.mkdir(exist_ok=True)
    name = "offline_throughput" + ("_quick" if args.quick else "") + ("" if dtypes == ["fp32"] else "_" + "_".join(dtypes))
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lc_on = bool(args.llama_server)
    vs_lc = ["int8"] if lc_on and "int8" in dtypes else []  # int8 is llmserve's format for this Q4_1 GGUF
    cols = [f"llmserve {d} tok/s" for d in dtypes] + ["HF fp32 tok/s"] + ["llama.cpp tok/s"] * lc_on + \
        [f"{d}/HF" for d in dtypes] + [f"{d}/llama.cpp" for d in vs_lc]
    lines = [f"`{meta['command']}`", "",
             (f"GEMM {rate:.0f} GFLOP/s -> fp32 compute ceiling {ceiling:.0f} tok/s; load avg "
              f"{meta['load_avg'][0]:.1f}; {in_len} in / {out_len} out; {args.threads} threads; {meta['date']}"), ""]
    if lc_on:
        lines += [(f"llama.cpp: llama-server {meta['llama_server_version']} on {src.name}, -np = concurrency, "
                   f"-t/-tb {args.threads}, --cont-batching; prompts sent as token ids"), ""]
    lines += ["| concurrency | prompts | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in rows:
        hf_t = r.get("hf_tok_s", float("nan"))
        lc_t = r.get("llamacpp_tok_s", float("nan"))
        cells = [f"{r[f'{d}_tok_s']:.1f}" for d in dtypes] + [f"{hf_t:.1f}"] + [f"{lc_t:.1f}"] * lc_on + \
            [f"{r[f'{d}_tok_s'] / hf_t:.2f}" for d in dtypes] + [f"{r[f'{d}_tok_s'] / lc_t:.2f}" for d in vs_lc]
        lines.append(f"| {r['concurrency']} | {r['prompts']} | " + " | ".join(cells) + " |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
