"""Resident memory of one engine, without its KV pool, against llama-server on the same GGUF.

    python benchmarks/engine/memory.py [--llama-server PATH]

Each engine variant starts in a fresh process (``--child``): imports, then the engine
(each ``--prefill-weights``, ``exact_activations``, fp32), with a 2,048-token KV pool
(llama-server's ``-c 2048``), then one greedy request of 16 tokens; VmRSS (and its
anonymous / file parts) from /proc/self/status at each point. llama-server starts with
``-c 2048 -np 1 -t 1``; its VmRSS is read after a first completion request. Then both
as users start them, every process of each, summed as RSS, PSS and USS.

Writes benchmarks/results/memory.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
LLAMA_SERVER = Path.home() / ".cache/llama-server-11434/build/bin/llama-server"
GGUF = Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
VARIANTS = {"int8 (default: prefill on weights unpacked a layer at a time)": {"dtype": "int8"},
            "int8, --prefill-weights fp32 (copies kept)": {"dtype": "int8", "prefill_weights": "fp32"},
            "int8, --prefill-weights int8": {"dtype": "int8", "prefill_weights": "int8"},
            "int8, exact activations": {"dtype": "int8", "exact_activations": True}, "fp32": {"dtype": "fp32"}}


def status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, RssAnon, RssFile in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def child(variant: str) -> dict:
    points = {}
    import torch

    points["imports"] = status()
    from llmserve import LLM, SamplingParams

    torch.set_num_threads(1)
    llm = LLM(str(GGUF), max_num_seqs=1, num_kv_blocks=128, block_size=16, **VARIANTS[variant])
    points["engine built"] = status()
    llm.generate([list(range(100, 116))], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    points["after a first request"] = status()
    pool = llm.engine.runner.kv_caches[0][0].untyped_storage()
    return {"variant": variant, "points": points, "kv_pool_bytes": pool.nbytes(),
            "kv_resident_bytes": resident_bytes(pool.data_ptr(), pool.nbytes())}


def resident_bytes(start: int, nbytes: int) -> int:
    """Resident bytes of this process's mappings overlapping [start, start + nbytes)."""
    import re

    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m[1], 16) < start + nbytes and int(m[2], 16) > start
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def llama_server(path: Path) -> dict:
    """llama-server with a 2,048-token pool, after a first request (both tables' row)."""
    port = 18000 + os.getpid() % 1000
    cmd = [str(path), "-m", str(GGUF), "-c", "2048", "-np", "1", "-t", "1", "--port", str(port)]
    return {"name": "llama-server", **instance(cmd, port, "/completion",
                                               {"prompt": "Hello", "n_predict": 16, "temperature": 0})}


def rollup(pid: int) -> dict[str, int]:
    """Rss, Pss and Uss (private pages) of one process, in bytes (/proc/PID/smaps_rollup)."""
    out = {"Rss": 0, "Pss": 0, "Uss": 0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        kb = int(value.split()[0]) * 1024 if value.strip() and value.split()[0].isdigit() else 0
        if key in ("Rss", "Pss"):
            out[key] += kb
        elif key in ("Private_Clean", "Private_Dirty"):
            out["Uss"] += kb
    return out


def tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += children(p)
    return pids


def first_request(port: int, path: str, body: dict, timeout: float = 240) -> None:
    data = json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=60).read()
            return
        except urllib.error.HTTPError as e:
            if e.code != 503:  # 503: still loading
                raise
            time.sleep(0.5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def instance(cmd: list[str], port: int, path: str, body: dict) -> dict:
    """A server as users run it (every process of it), after one request: summed Rss, Pss, Uss."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first_request(port, path, body)
        time.sleep(1)
        procs = {p: rollup(p) for p in tree(proc.pid)}
        total = {k: sum(r[k] for r in procs.values()) for k in ("Rss", "Pss", "Uss")}
        return {"command": " ".join(cmd), "processes": len(procs), **total,
                "points": {"after a first request": status(proc.pid)}}
    finally:
        proc.terminate()
        proc.wait(30)


def instances(llama: dict | None) -> list[dict]:
    """``llmserve engine`` at its defaults (a 2,048-token pool, as llama-server's -c 2048) beside
    ``llama`` (:func:`llama_server`'s row)."""
    port = 18100 + os.getpid() % 500
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 16, "temperature": 0}
    rows = [{"name": "llmserve engine (defaults)", **instance(
        [sys.executable, "-m", "llmserve.cli", "engine", "--model", str(GGUF), "--port", str(port),
         "--num-kv-blocks", "128", "--block-size", "16", "--served-model-name", "SmolLM2-135M-Instruct"], port,
        "/v1/completions", body)}]
    return rows + ([llama] if llama is not None else [])


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


SERVE_YAML = """host: 127.0.0.1
port: {port}
model: {model}
engine_args: ["--num-kv-blocks", "128", "--block-size", "16"]
threads_per_instance: 1
log_level: warning
provider: {{kind: local, log_dir: {logs}}}
autoscale: {{policy: static, bounds: {{min_instances: {n}, max_instances: {n}}}}}
"""


def served(n: int, work: Path) -> dict:
    """``llmserve serve`` with a static pool of ``n`` instances forked from its template:
    every process's PSS and USS after a few requests, and each instance's USS."""
    port = 18600 + os.getpid() % 300 + n
    cfg = work / f"serve-{n}.yaml"
    cfg.write_text(SERVE_YAML.format(port=port, model=GGUF, logs=work / f"logs-{n}", n=n))
    proc = subprocess.Popen([sys.executable, "-m", "llmserve.cli", "serve", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        body = {"model": GGUF.stem, "prompt": "Hello", "max_tokens": 16, "temperature": 0}
        deadline = time.monotonic() + 240
        while len(tree(proc.pid)) < 2 + 2 * n and time.monotonic() < deadline:  # serve, template, n x (API, engine)
            time.sleep(1)
        time.sleep(20)  # the last instance's load and warm-up
        for _ in range(2 * n):
            first_request(port, "/v1/completions", body)
        time.sleep(1)
        procs = {p: rollup(p) for p in tree(proc.pid)}
        apis = [a for t in children(proc.pid) for a in children(t)]  # serve -> template -> instances
        instance_uss = [sum(procs[p]["Uss"] for p in tree(a)) for a in apis]
        return {"instances": n, "processes": len(procs), "Pss": sum(r["Pss"] for r in procs.values()),
                "Uss": sum(r["Uss"] for r in procs.values()), "instance_uss": instance_uss}
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default=None)
    ap.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    rows = [json.loads(subprocess.run([sys.executable, __file__, "--child", v], capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for v in VARIANTS]
    ref = llama_server(args.llama_server) if args.llama_server.is_file() else None
    servers = instances(ref)
    mb = 1e6
    lines = ["`python benchmarks/engine/memory.py`: SmolLM2-135M-Instruct Q4_1, one engine per fresh process, "
             "KV pool of 2,048 tokens (mapped lazily, 4 KiB at a time: its resident part shown), one 16-token "
             "prompt + 16 tokens. MB = 10^6 bytes.", "",
             "| process | RSS after imports | RSS, engine built | RSS after a first request | of which anon / file "
             "| KV pool resident |", "|---|---|---|---|---|---|"]
    for r in rows:
        p = r["points"]
        last = p["after a first request"]
        lines.append(f"| llmserve, {r['variant']} | {p['imports']['VmRSS'] / mb:.0f} MB | "
                     f"{p['engine built']['VmRSS'] / mb:.0f} MB | {last['VmRSS'] / mb:.0f} MB | "
                     f"{last['RssAnon'] / mb:.0f} / {last['RssFile'] / mb:.0f} MB | {r['kv_resident_bytes'] / mb:.1f} of {r['kv_pool_bytes'] / mb:.0f} MB |")
    if ref:
        last = ref["points"]["after a first request"]
        lines.append(f"| llama-server (`{ref['command'].replace(str(Path.home()), '~')}`) | | | "
                     f"{last['VmRSS'] / mb:.0f} MB | {last['RssAnon'] / mb:.0f} / {last['RssFile'] / mb:.0f} MB | |")
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="llmserve-memory-"))
    pools = [served(n, work) for n in (1, 2)]
    kv = 2048 * 30 * 2 * 192 * 2  # both pools: 2,048 tokens x 30 layers x K, V x 3 heads x 64 x fp16
    lines += ["", "Whole servers as users start them (every process; PSS shares a page among the processes that "
              "map it, USS counts private pages only), after one request. Both KV pools hold 2,048 fp16 tokens "
              f"({kv / mb:.0f} MB): llama-server zeroes its pool at start, so all of it is resident and is taken "
              "off; llmserve maps its pool lazily, and nothing is taken off (its few resident pages stay in):", "",
              "| server | processes | RSS | PSS | USS | PSS less the KV pool |", "|---|---|---|---|---|---|"]
    for r in servers:
        r["less_kv"] = r["Pss"] - (kv if r["name"] == "llama-server" else 0)
        lines.append(f"| {r['name']} (`{r['command'].replace(str(Path.home()), '~').replace(sys.executable, 'python')}`) "
                     f"| {r['processes']} | {r['Rss'] / mb:.0f} MB | {r['Pss'] / mb:.0f} MB | {r['Uss'] / mb:.0f} MB "
                     f"| {r['less_kv'] / mb:.0f} MB |")
    if len(servers) == 2:
        lines += ["", f"llmserve / llama-server, PSS less the KV pool: {servers[0]['less_kv'] / servers[1]['less_kv']:.2f}x."]
    lines += ["", "`llmserve serve` (gateway and controller, the template, each instance's API and engine "
              "process) with a static pool forked from the template, after a few requests; the template's torch "
              "pages and the weights file are shared by every instance:", "",
              "| instances | processes | PSS, all | USS, all | USS of each instance (API + engine) |", "|---|---|---|---|---|"]
    for r in pools:
        lines.append(f"| {r['instances']} | {r['processes']} | {r['Pss'] / mb:.0f} MB | {r['Uss'] / mb:.0f} MB | "
                     f"{', '.join(f'{u / mb:.0f} MB' for u in r['instance_uss'])} |")
    if len(pools) == 2:
        lines += ["", f"The second instance added {(pools[1]['Pss'] - pools[0]['Pss']) / mb:.0f} MB PSS to the "
                      "deployment."]
    out = ROOT / "benchmarks" / "results"
    (out / "memory.json").write_text(json.dumps({"llmserve": rows, "llama_server": ref, "servers": servers,
                                                 "serve": pools},
                                                indent=2))
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
