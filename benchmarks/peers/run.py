"""llmserve against llama.cpp's llama-server: same GGUF, same threads, HTTP streaming.

    python benchmarks/peers/run.py --llama-server /root/.cache/llama-server-11434/build/bin/llama-server \\
        --gguf ~/.cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf --threads 1 --write

Both servers are driven by ``llmserve bench`` (103-token distinct prompts, 128
tokens out, ignore_eos, temperature 0, ``/v1/completions`` with ``stream``), one
concurrency at a time, the servers alternating so that a shared machine's load
falls on both alike. Then head-of-line: realtime requests' TTFT on an idle
llmserve and while two clients stream 2k-token batch prompts; and each server's
memory (PSS over each server's processes). The
table, with the commands, goes to benchmarks/peers/README.md (``--write``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PY = sys.executable
HERE = Path(__file__).resolve().parent


def wait_ready(url: str, path: str, timeout: float = 900) -> None:  # a busy shared host starts slowly
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url}{path} not ready")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_pss_mb(pid: int) -> float:
    """PSS summed over a server's processes (a page shared by several counts once in all)."""
    pids, total = [pid], 0
    while pids:
        p = pids.pop()
        try:
            for line in open(f"/proc/{p}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
            pids += [int(c) for c in open(f"/proc/{p}/task/{p}/children").read().split()]
        except OSError:
            pass
    return total / 1024


def bench(url: str, gguf: str, out: Path, *, concurrency: int, prompts: int, input_len: int = 103,
          output_len: int = 128, batch_share: float = 0.0, seed: int = 0) -> list[str]:
    cmd = [PY, "-m", "llmserve.bench", "--base-url", url + "/v1", "--endpoint", "completions", "--ignore-eos",
           "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", "0", "--tokenizer", gguf, "--num-warmups", "1", "--seed", str(seed),
           "--batch-share", str(batch_share), "--save-result", str(out), "--disable-tqdm"]
    return cmd


def summary(path: Path) -> dict:
    return json.loads(path.read_text())["summary"]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env={**os.environ})


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=20)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t; llmserve --threads (unset: its default)")
    ap.add_argument("--llmserve-threads", type=int, default=None,
                    help="llmserve's torch threads (default: its own default for this machine)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=1, help="rounds of every level, fresh prompts each")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the prompt counts (quick runs: 0.5)")
    ap.add_argument("--serve", action="store_true", help="also `llmserve serve` at its defaults (gateway + "
                                                          "elastic pool) beside `llmserve engine`")
    ap.add_argument("--write", action="store_true", help="write the table into README.md")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--results", type=Path, default=None, help="write the table to this file instead")
    ap.add_argument("--skip-hol", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    lport, mport, sport = free_port(), free_port(), free_port()  # other servers share this machine
    lcmd = [args.llama_server, "-m", args.gguf, "-np", "64", "-c", "32768", "-t", str(args.threads),
            "--port", str(lport), "--host", "127.0.0.1"]
    mcmd = [PY, "-m", "llmserve.cli", "engine", "--model", args.gguf, "--port", str(mport), "--max-num-seqs", "64"]
    if args.llmserve_threads:
        mcmd += ["--threads", str(args.llmserve_threads)]
    servers = {"llama.cpp": (lcmd, f"http://127.0.0.1:{lport}", "/health"),
               "llmserve": (mcmd, f"http://127.0.0.1:{mport}", "/ready")}
    if args.serve:
        scmd = [PY, "-m", "llmserve.cli", "serve", "--model", args.gguf, "--port", str(sport)]
        servers["serve"] = (scmd, f"http://127.0.0.1:{sport}", "/ready")
    procs = {name: start(cmd, work / f"{name}.log") for name, (cmd, _, _) in servers.items()}
    rows, pss, hol, cmds = [], {}, {}, [" ".join(c) for c, _, _ in servers.values()]
    try:
        for name, (_, url, path) in servers.items():
            wait_ready(url, path)
        # 16 single streams: a round of 6 lasted ~3 s, short enough for the host's swings
        # to move serve / engine by 10 % from round to round (80 paired requests: 0.97).
        counts = {1: 16, 16: 32, 64: 64}
        for level, c in enumerate(args.concurrency):
            n = max(c, int(counts.get(c, 2 * c) * args.scale))
            for rnd in range(args.rounds):
                row = {"c": c, "round": rnd}
                order = list(servers) if (c + rnd) % 2 else list(servers)[::-1]  # alternate who goes first
                for name in order:
                    url = servers[name][1]
                    out = work / f"{name}-c{c}-r{rnd}.json"
                    # Fresh prompts for every level and round: none hits an earlier run's prefix cache.
                    # The servers of a round get the same ones (each has its own cache): with n-gram
                    # speculation a prompt's continuation moves TPOT, so different prompts per server
                    # compared prompts as much as servers (serve's c = 1 came out 1.5x the engine's).
                    seed = 1000 * (level + 1) + 100 * rnd
                    cmd = bench(url, args.gguf, out, concurrency=c, prompts=n, seed=seed, output_len=args.output_len)
                    cmds.append(" ".join(cmd[1:]).replace(url, f"<{name}>"))
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                    s = summary(out)
                    row[name] = s
                    print(f"c={c} round {rnd} {name}: {s['output_throughput']:.1f} tok/s, TPOT median "
                          f"{s['median_tpot_ms']:.1f} ms, TTFT median {s['median_ttft_ms']:.0f} ms", flush=True)
                rows.append(row)
        for name in servers:
            pss[name] = tree_pss_mb(procs[name].pid)
        if not args.skip_hol:
            hol = head_of_line(servers["llmserve"][1], args.gguf, work, cmds)
    finally:
        for p in procs.values():
            stop(p)
    load = os.getloadavg()
    table = render(rows, pss, hol, cmds, load, args)
    print(table)
    if args.results is not None:
        args.results.write_text(table)
    elif args.write:
        readme = HERE / "README.md"
        head = readme.read_text().split("<!-- results -->")[0] if readme.exists() else ""
        readme.write_text(head + "<!-- results -->\n" + table)
    return 0


def head_of_line(url: str, gguf: str, work: Path, cmds: list[str]) -> dict:
    """Realtime TTFT idle, then while two clients stream 2k-token batch prompts."""
    idle = work / "rt-idle.json"
    rt = bench(url, gguf, idle, concurrency=1, prompts=12, output_len=32, seed=1)
    subprocess.run(rt, check=True, stdout=subprocess.DEVNULL)
    bg_cmd = bench(url, gguf, work / "bg.json", concurrency=2, prompts=40, input_len=2048, output_len=64,
                   batch_share=1.0, seed=2)
    cmds += [" ".join(rt[1:]).replace(url, "<llmserve>"), " ".join(bg_cmd[1:]).replace(url, "<llmserve>")]
    bg = subprocess.Popen(bg_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(8)  # both batch clients are prefilling or decoding by now
        loaded = work / "rt-loaded.json"
        subprocess.run(bench(url, gguf, loaded, concurrency=1, prompts=12, output_len=32, seed=3), check=True,
                       stdout=subprocess.DEVNULL)
    finally:
        stop(bg)
    a, b = summary(idle), summary(loaded)
    return {"idle_p90": a["p90_ttft_ms"], "loaded_p90": b["p90_ttft_ms"], "idle_median": a["median_ttft_ms"],
            "loaded_median": b["median_ttft_ms"]}


def ratio(r: dict, top: str, bottom: str) -> float:
    return r[top]["output_throughput"] / r[bottom]["output_throughput"]


def medians(rows: list[dict], serve: bool) -> list[str]:
    """Each level's median over its rounds of the paired ratios, and for serve / engine the
    rounds taken two by two. The servers of a round run back to back and the order flips
    every round, so a host whose speed drifts over a round's minutes favours one side in
    one round and the other in the next: the geometric mean of two consecutive rounds
    (each server once first) cancels a steady drift (an ABBA design)."""
    out = ["Median over the rounds of each round's ratio (every round listed above)"
           + ("; serve / engine also over pairs of consecutive rounds, the geometric mean of each pair:"
              if serve else ":"), "",
           "| concurrency | rounds | llmserve / llama.cpp | TPOT llama.cpp / llmserve |"
           + (" serve / engine | serve / engine, pairs of rounds |" if serve else ""),
           "|---|---|---|---|" + ("---|---|" if serve else "")]
    for c in sorted({r["c"] for r in rows}):
        level = [r for r in rows if r["c"] == c]
        tpot = statistics.median(r["llama.cpp"]["median_tpot_ms"] / r["llmserve"]["median_tpot_ms"] for r in level)
        cells = [str(c), str(len(level)), f"{statistics.median(ratio(r, 'llmserve', 'llama.cpp') for r in level):.2f}x",
                 f"{tpot:.2f}x"]
        if serve:
            each = [ratio(r, "serve", "llmserve") for r in level]
            pairs = [(a * b) ** 0.5 for a, b in zip(each[::2], each[1::2])]
            cells += [f"{statistics.median(each):.2f}x",
                      (f"{statistics.median(pairs):.2f}x ({', '.join(f'{p:.2f}' for p in pairs)})" if pairs else "-")]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render(rows, pss, hol, cmds, load, args) -> str:
    serve = any("serve" in r for r in rows)
    out = [f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
           f"load average after the run {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (a shared machine: "
           "ratios within this one run are what counts).", "",
           "| concurrency | round | llama.cpp tok/s | llmserve tok/s | ratio |"
           + (" serve tok/s | serve / engine |" if serve else "")
           + " llama.cpp TPOT median (ms) | llmserve TPOT median (ms) | llama.cpp TTFT median (ms) | "
             "llmserve TTFT median (ms) |",
           "|---|---|---|---|---|" + ("---|---|" if serve else "") + "---|---|---|---|"]
    for r in rows:
        a, b = r["llama.cpp"], r["llmserve"]
        cells = [f"{r['c']}", f"{r['round'] + 1}", f"{a['output_throughput']:.1f}", f"{b['output_throughput']:.1f}",
                 f"{ratio(r, 'llmserve', 'llama.cpp'):.2f}x"]
        if serve:
            cells += [f"{r['serve']['output_throughput']:.1f}", f"{ratio(r, 'serve', 'llmserve'):.2f}x"]
        cells += [f"{a['median_tpot_ms']:.1f}", f"{b['median_tpot_ms']:.1f}", f"{a['median_ttft_ms']:.0f}",
                  f"{b['median_ttft_ms']:.0f}"]
        out.append("| " + " | ".join(cells) + " |")
    if args.rounds > 1:
        out += ["", *medians(rows, serve)]
    out += ["", f"Memory after the runs, PSS summed over each server's processes, KV pools included (llama.cpp's "
                f"32,768 tokens, llmserve's sized from free memory; `benchmarks/engine/memory.py` compares them "
                f"with equal pools): llama.cpp {pss.get('llama.cpp', 0):.0f} MB, llmserve (API + engine process) "
                f"{pss.get('llmserve', 0):.0f} MB."]
    if hol:
        out += ["", "Head-of-line (llmserve, defaults): realtime TTFT p90 "
                    f"{hol['idle_p90']:.0f} ms idle, {hol['loaded_p90']:.0f} ms while two clients stream "
                    f"2,048-token batch prompts ({hol['loaded_p90'] / hol['idle_p90']:.2f}x; medians "
                    f"{hol['idle_median']:.0f} / {hol['loaded_median']:.0f} ms)."]
    out += ["", "Commands:", "", "```", f"python benchmarks/peers/run.py {' '.join(sys.argv[1:])}", *cmds, "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
