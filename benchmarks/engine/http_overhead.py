"""What the HTTP layer costs (issue 5): one workload offline and through ``llmserve engine``.

The same prompts (random text of exact token length, ``ignore_eos``, greedy) at the
same concurrency run (a) in this process on an ``EngineCore`` kept at that
concurrency and (b) through HTTP with the ``llmserve bench`` client against an
``llmserve engine`` subprocess with the same engine options; repetitions
alternate. Also records the instance's start-to-ready time (``/ready`` 200) cold
(an empty model store: the GGUF is converted and written) and warm (the converted
copy is memory-mapped).

    python benchmarks/engine/http_overhead.py [--quick] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import (
    MODEL,
    ROOT,
    EngineCore,
    Loaded,
    command_line,
    greedy,
    load,
    loadavg,
    machine,
    md_table,
    pct,
    write_results,
)

from llmserve.autoscale.providers.process import terminate
from llmserve.bench.ready import first_served_model
from llmserve.bench.client import EndpointConfig
from llmserve.bench.datasets import SampleRequest, random_dataset
from llmserve.bench.metrics import e2el, summarize, ttft
from llmserve.bench.runner import run_requests
from llmserve.bench.tokenizer import load_tokenizer as bench_tokenizer


# ---- the server subprocess -------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, engine_args: list[str], log_path: Path, store: Path | None = None) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "llmserve.cli", "engine", "--model", MODEL, "--port", str(self.port),
               *engine_args]
        if store is not None:
            cmd += ["--model-store", str(store)]
        self.log_path = log_path
        self.t_spawn = time.monotonic()
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300.0) -> tuple[float, float | None]:
        """Seconds from spawn to the first ``/ready`` 200, and the server's own ``ready_after_s``."""
        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engine exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
                try:
                    r = c.get(self.url + "/ready", timeout=1.0)
                    if r.status_code == 200:
                        return time.monotonic() - self.t_spawn, r.json().get("ready_after_s")
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
        raise TimeoutError(f"not ready after {timeout} s:\n{self.log_path.read_text()}")

    def cpu_seconds(self) -> float:
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        terminate(self.proc, 30.0)


def startup_times(args: argparse.Namespace, m: Loaded, engine_args: list[str], logdir: Path) -> dict[str, Any]:
    """Cold: a fresh store holding only the GGUF; warm: the same store again."""
    store = Path(tempfile.mkdtemp(prefix="llmserve-store-", dir="/tmp"))
    try:
        dst = store / MODEL
        dst.mkdir()
        shutil.copy2(m.source, dst / m.source.name)
        shutil.copy2(m.source.parent / "manifest.json", dst / "manifest.json")
        out: dict[str, Any] = {"cold": [], "warm": []}
        for kind in ["cold"] + ["warm"] * (1 if args.quick else 3):
            s = Server(engine_args, logdir / f"start-{kind}-{len(out[kind])}.log", store)
            try:
                wall, own = s.wait_ready()
            finally:
                s.stop()
            out[kind].append({"spawn_to_ready_s": wall, "server_ready_after_s": own, "loadavg": loadavg()[0]})
            print(f"  {kind} start: {wall:.2f} s to /ready 200 (server says {own})", flush=True)
        out["imports"] = import_times()
        return out
    finally:
        shutil.rmtree(store, ignore_errors=True)


def import_times(n: int = 2) -> dict[str, float]:
    """Best-of-n seconds for a fresh interpreter to do the start-up's import work."""
    snippets = {
        "python alone": "pass",
        "import torch": "import torch",
        "import llmserve.server.app (torch, fastapi, engine)": "import llmserve.server.app",
        "llmserve CLI parser (the engine subcommand; other layers are imported only when chosen)":
            "import llmserve.cli as c; c.build_parser()",
        "CLI parser + server app": "import llmserve.cli as c; c.build_parser(); import llmserve.server.app",
    }
    out = {}
    for name, code in snippets.items():
        best = float("inf")
        for _ in range(n):
            t = time.monotonic()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
            best = min(best, time.monotonic() - t)
        out[name] = best
    return out


# ---- the two ways of running the workload -----------------------------------------------------
def offline(core: EngineCore, reqs: list[SampleRequest], conc: int, tag: str) -> dict[str, Any]:
    """Closed loop at ``conc`` requests in flight, as the bench client keeps the server."""
    cpu0, t0 = time.process_time(), time.monotonic()
    todo = list(range(len(reqs)))
    finals = {}

    def add() -> None:
        i = todo.pop(0)
        core.add_request(f"{tag}-{i}", reqs[i].prompt, greedy(reqs[i].output_len, ignore_eos=True),
                         arrival_time=time.monotonic())

    for _ in range(min(conc, len(todo))):
        add()
    while core.has_unfinished():
        for out in core.step():
            if out.finished:
                finals[out.request_id] = out
                if todo:
                    add()
    wall = time.monotonic() - t0
    outs = list(finals.values())
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    tpot = [(o.metrics.last_token_time - o.metrics.first_token_time) / (len(o.token_ids) - 1)
            for o in outs if len(o.token_ids) > 1]
    n_out = sum(len(o.token_ids) for o in outs)
    return {"wall": wall, "output_tokens": n_out, "input_tokens": sum(len(o.prompt_token_ids) for o in outs),
            "output_tps": n_out / wall, "ttft": ttft, "tpot": tpot, "cpu_s": time.process_time() - cpu0,
            "completed": len(outs)}


def over_http(server: Server, reqs: list[SampleRequest], warm: list[SampleRequest], conc: int,
              tok: Any) -> dict[str, Any]:
    cfg = EndpointConfig(base_url=server.url + "/v1", model="-", ignore_eos=True)
    cfg = cfg.model_copy(update={"model": first_served_model(cfg)})
    cpu0, scpu0 = time.process_time(), server.cpu_seconds()
    outcome = asyncio.run(run_requests(cfg, reqs, [0.0] * len(reqs), conc, warm, tok, show_progress=False))
    client_cpu, server_cpu = time.process_time() - cpu0, server.cpu_seconds() - scpu0
    s = summarize(outcome.records, outcome.duration_s, (50.0, 90.0, 99.0))
    ok = [r for r in outcome.records if r.success]
    if not ok:
        raise RuntimeError(f"every HTTP request failed: {outcome.records[0].failure_label} {outcome.records[0].error}")
    return {"wall": outcome.duration_s, "output_tokens": s.total_output_tokens,
            "input_tokens": s.server_prompt_tokens, "output_tps": s.output_throughput,
            "ttft": [ttft(r) for r in ok], "tpot": [(e2el(r) - ttft(r)) / (r.output_tokens - 1)
                                                    for r in ok if r.output_tokens > 1],
            "cpu_s": server_cpu, "client_cpu_s": client_cpu, "completed": s.completed, "failed": s.failed}


CATEGORIES = [  # first match wins, checked against the whole stack of a sample
    ("model forward (runner.execute)", "execute (llmserve/engine/runner.py"),
    ("sampling (engine._sample)", "_sample (llmserve/engine/engine.py"),
    ("scheduler", "llmserve/engine/scheduler.py"),
    ("detokenise / outputs (output_processor)", "llmserve/engine/output_processor.py"),
    ("InThreadEngine delivery", "llmserve/engine/in_thread.py"),
    ("llmserve/server (OpenAI layer, SSE)", "llmserve/server/"),
    ("uvicorn / h11 / starlette / fastapi", ("uvicorn", "/h11/", "starlette", "fastapi")),
    ("httpx / bench client", ("httpx", "httpcore", "llmserve/bench/")),
    ("asyncio event loop", "asyncio"),
]


def py_spy(binary: str, pid: int, out: Path) -> subprocess.Popen:
    return subprocess.Popen([binary, "record", "--pid", str(pid), "--rate", "50", "--format", "raw",
                             "--nonblocking", "--output", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop_py_spy(proc: subprocess.Popen, out: Path) -> dict[str, float]:
    """Share of non-idle samples per category, and per thread."""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    cats: dict[str, float] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        name = "other"
        for cat, pat in CATEGORIES:
            if any(p in stack for p in ((pat,) if isinstance(pat, str) else pat)):
                name = cat
                break
        cats[name] = cats.get(name, 0) + int(n)
    return {k: v / total for k, v in sorted(cats.items(), key=lambda kv: -kv[1])} | {"samples": total}


def profile_both(args: argparse.Namespace, core: EngineCore, server: Server, tok: Any, n: int, in_len: int,
                 out_len: int, conc: int, logdir: Path) -> dict[str, Any]:
    """One more rep of each path under py-spy (sampling, 50 Hz, non-blocking)."""
    reqs = random_dataset(tok, n, in_len, out_len, 0.0, seed=99)
    warm = random_dataset(tok, 2, in_len, out_len, 0.0, seed=1099)
    out: dict[str, Any] = {}
    prof = py_spy(args.py_spy, os.getpid(), logdir / "offline.txt")
    time.sleep(1.0)
    off = offline(core, reqs, conc, "prof")
    out["offline"] = {"result": off["output_tps"], "cpu_s": off["cpu_s"],
                      "shares": stop_py_spy(prof, logdir / "offline.txt")}
    prof = py_spy(args.py_spy, server.proc.pid, logdir / "server.txt")
    time.sleep(1.0)
    http = over_http(server, reqs, warm, conc, tok)
    out["http"] = {"result": http["output_tps"], "cpu_s": http["cpu_s"],
                   "shares": stop_py_spy(prof, logdir / "server.txt")}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--threads", type=int, default=1, help="torch threads, here and in the server")
    p.add_argument("--skip-startup", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="repetitions of the pair (default 3, quick 1)")
    p.add_argument("--py-spy", default=None, metavar="BIN",
                   help="after the measured reps, profile one more rep of each path with this py-spy binary "
                        "(results go to http_overhead-profile.md)")
    args = p.parse_args()
    info = machine()
    print("load average", info["loadavg_start"], flush=True)
    n, in_len, out_len, conc, reps = (8, 64, 16, 4, 1) if args.quick else (32, 128, 64, 16, 3)
    reps = args.reps or reps
    engine_opts = {"threads": args.threads, "max_num_seqs": conc, "num_kv_blocks": 512}
    engine_args = ["--threads", str(args.threads), "--max-num-seqs", str(conc), "--num-kv-blocks", "512"]
    logdir = Path(tempfile.mkdtemp(prefix="llmserve-http-bench-", dir="/tmp"))
    m = load()
    start = None if args.skip_startup else startup_times(args, m, engine_args, logdir)

    from llmserve.models.model_source import cache_dir

    tok = bench_tokenizer(cache_dir(m.source, m.store))
    core = m.core(**engine_opts)
    server = Server(engine_args, logdir / "server.log")
    server.wait_ready()
    runs: dict[str, list[dict[str, Any]]] = {"offline": [], "http": []}
    try:
        for r in range(reps):
            reqs = random_dataset(tok, n, in_len, out_len, 0.0, seed=r)
            warm = random_dataset(tok, 2, in_len, out_len, 0.0, seed=1000 + r)
            order = ["offline", "http"] if r % 2 == 0 else ["http", "offline"]
            for kind in order:
                la = loadavg()[0]
                if kind == "offline":
                    offline(core, warm, conc, f"w{r}")
                    res = offline(core, reqs, conc, f"r{r}")
                else:
                    res = over_http(server, reqs, warm, conc, tok)
                res["loadavg"] = la
                runs[kind].append(res)
                print(f"  rep {r} {kind}: {res['output_tps']:.2f} out tok/s, TTFT p50 "
                      f"{pct(res['ttft'], 50):.2f} s, load {la:.2f}", flush=True)
        prof = (profile_both(args, core, server, tok, n, in_len, out_len, conc, logdir)
                if args.py_spy else None)
    finally:
        server.stop()
    rows = []
    for r in range(reps):
        for kind in ("offline", "http"):
            x = runs[kind][r]
            rows.append([r + 1, kind, x["completed"], x["output_tps"], pct(x["ttft"], 50) * 1e3,
                         pct(x["ttft"], 99) * 1e3, np.mean(x["tpot"]) * 1e3, x["wall"],
                         x["cpu_s"], x.get("client_cpu_s", 0.0), f"{x['loadavg']:.2f}"])
    ratios = [h["output_tps"] / o["output_tps"] for o, h in zip(runs["offline"], runs["http"])]
    tot = {k: sum(x["output_tokens"] for x in v) / sum(x["wall"] for x in v) for k, v in runs.items()}
    md = md_table(["rep", "path", "completed", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT mean ms",
                   "wall s", "engine/server CPU s", "client CPU s", "load avg"], rows)
    cost = 1 - tot["http"] / tot["offline"]
    md += (f"\n\n{n} prompts of {in_len} tokens (random text, exact length), {out_len} output tokens "
           f"(ignore_eos, greedy), concurrency {conc}; engine options `{' '.join(engine_args)}` on both "
           f"paths. HTTP: `llmserve bench`'s client (streamed /v1/completions, usage in the last chunk, "
           f"2 warm-up requests) in this process against an `llmserve engine` subprocess; offline: an "
           f"EngineCore in this process kept at {conc} requests in flight. HTTP/offline throughput per "
           f"rep: {', '.join(f'{x:.3f}' for x in ratios)}; pooled: {tot['http']:.2f} vs "
           f"{tot['offline']:.2f} output tok/s, **HTTP costs {cost * 100:.1f}% throughput** "
           f"(target ≤ 5%: {'met' if cost <= 0.05 else 'missed'}). The client shares the 2 CPUs "
           f"with the server here.")
    sections = [("Throughput and TTFT, offline vs HTTP", md)]
    if prof:
        cats = list(dict.fromkeys(k for side in ("http", "offline") for k in prof[side]["shares"] if k != "samples"))
        pmd = md_table(["where the samples fall", "offline process", "server process"],
                       [[c, f"{prof['offline']['shares'].get(c, 0) * 100:.1f}%", f"{prof['http']['shares'].get(c, 0) * 100:.1f}%"]
                        for c in cats]
                       + [["non-idle samples (50 Hz)", prof["offline"]["shares"]["samples"], prof["http"]["shares"]["samples"]],
                          ["process CPU s", prof["offline"]["cpu_s"], prof["http"]["cpu_s"]],
                          ["output tok/s in this profiled rep", prof["offline"]["result"], prof["http"]["result"]]])
        sections.append(("Where the HTTP path's time goes (py-spy)", pmd + "\n\nOne extra rep of each path "
                         "sampled with `py-spy record --rate 50 --nonblocking` (first matching category "
                         "over the whole stack; the offline column samples this benchmark process)."))
    if start:
        srows = [[kind, i + 1, x["spawn_to_ready_s"], x["server_ready_after_s"], f"{x['loadavg']:.2f}"]
                 for kind in ("cold", "warm") for i, x in enumerate(start[kind])]
        warm_best = min(x["spawn_to_ready_s"] for x in start["warm"])
        smd = md_table(["start", "#", "spawn → /ready 200 s", "server's ready_after_s", "load avg"], srows)
        smd += (f"\n\n`llmserve engine --model {MODEL} {' '.join(engine_args)} --model-store <fresh dir>`; "
                f"cold = the store holds only the GGUF (dequantised, converted and written as safetensors "
                f"during start-up); warm = the same store again (converted copy reused). The OS file cache "
                f"is warm in both. Spawn → ready includes the Python interpreter and imports; the server's "
                f"own figure counts from its app start. Warm best {warm_best:.2f} s (target ≤ 3 s: "
                f"{'met' if warm_best <= 3 else 'missed'}).")
        imd = md_table(["fresh interpreter doing", "seconds (best of 2)"],
                       [[k, v] for k, v in start["imports"].items()])
        smd += ("\n\nWhere a warm start's time goes: the interpreter's imports before the server's clock starts "
                "(measured separately, same load):\n\n" + imd)
        sections.append(("Start-to-ready", smd))
    info["torch_threads"] = args.threads
    paths = write_results("http_overhead" + ("-profile" if args.py_spy else ""), args.quick, command_line(), info, sections,
                          {"runs": runs, "startup": start, "http_cost": cost, "ratios": ratios,
                           "profile": prof})
    for title, s in sections:
        print(f"## {title}\n\n{s}\n")
    print("wrote", *paths, "; server logs in", logdir)


if __name__ == "__main__":
    main()
