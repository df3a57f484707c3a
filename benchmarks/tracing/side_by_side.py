"""Throughput of the plain and the traced stack driven at the same time (``overhead.py
--side-by-side``).

Taking turns, as ``overhead.py``'s bench runs do, compares two stacks under whatever
the shared machine's other jobs did in each one's minutes: on the 2-CPU machine the
same stack's throughput moves by tens of percent from run to run, far more than the
3 % the target is about. Here both stacks are loaded at once, each by a client process
of its own (concurrency 8, streaming, the same prompts) for the same window: they
compete for the same CPUs at the same moments, so whichever needs more CPU per request
finishes fewer. A round's figure is the traced stack's output tokens over the plain
one's, counting the requests that finished inside the window; the order the clients
start in alternates per round. Each process's CPU over the window comes from ``/proc``.

    python benchmarks/tracing/side_by_side.py --url URL --go G --seconds S --out F ...

is the client (run by ``overhead.py``): ready (``F.ready``), it waits for the start
time in ``G``, and its counts go to ``F`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def drive(args: argparse.Namespace) -> dict:
    from llmserve.bench.client import EndpointConfig, make_http_client, send_request
    from llmserve.bench.datasets import random_dataset
    from llmserve.bench.tokenizer import load_tokenizer

    reqs = random_dataset(load_tokenizer(args.tokenizer), 256, args.input_len, args.output_len, seed=args.seed)
    cfg = EndpointConfig(base_url=args.url, model=args.model, ignore_eos=True, timeout_s=600)
    client = make_http_client(args.concurrency)
    done = {"requests": 0, "output_tokens": 0, "failed": 0}
    go = Path(args.go)
    try:
        await send_request(client, cfg, reqs[0], -1, time.perf_counter())  # a warm connection
        Path(args.out + ".ready").write_text("")
        while not go.exists() or not go.read_text():  # the start both clients are given
            await asyncio.sleep(0.01)
        start = float(go.read_text())
        end = start + args.seconds
        await asyncio.sleep(max(0.0, start - time.time()))

        async def worker(k: int) -> None:
            i = k
            while time.time() < end:
                rec = await send_request(client, cfg, reqs[i % len(reqs)], i, time.perf_counter())
                i += args.concurrency
                if time.time() > end:
                    break  # (finished after the window: not counted)
                if rec.success:
                    done["requests"] += 1
                    done["output_tokens"] += rec.output_tokens
                else:
                    done["failed"] += 1

        await asyncio.gather(*(worker(k) for k in range(args.concurrency)))
    finally:
        await client.aclose()
    return done


def rounds(args: argparse.Namespace, urls: dict[str, str], tokenizer: str | None, pids: dict[str, int],
           cpu_s, logdir: Path, model: str) -> list[dict]:
    """``args.rounds`` windows of ``args.window_s`` seconds with both stacks under load
    (``urls``: ``direct``, the plain stack, and ``traced``)."""
    out = []
    for rnd in range(args.rounds):
        files = {t: logdir / f"side-by-side-{rnd}-{t}.json" for t in urls}
        go = logdir / f"side-by-side-{rnd}.go"
        order = list(urls) if rnd % 2 == 0 else list(reversed(urls))
        clients = [subprocess.Popen([
            sys.executable, __file__, "--url", urls[t], "--go", str(go), "--seconds", str(args.window_s),
            "--out", str(files[t]), "--tokenizer", str(tokenizer), "--model", model,
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--concurrency", str(args.concurrency), "--seed", str(args.seed + rnd)], cwd=ROOT) for t in order]
        deadline = time.time() + 300
        while not all(Path(f"{f}.ready").exists() for f in files.values()):  # tokenizer loaded, connection warm
            if time.time() > deadline or any(c.poll() is not None for c in clients):
                raise RuntimeError("a side-by-side client did not get ready")
            time.sleep(0.05)
        start = time.time() + 0.5
        go.write_text(str(start))
        time.sleep(max(0.0, start - time.time()))
        cpu0 = {k: cpu_s(p) for k, p in pids.items()}
        time.sleep(args.window_s)
        cpu = {k: cpu_s(p) - cpu0[k] for k, p in pids.items()}
        for c in clients:
            if c.wait(timeout=600) != 0:
                raise RuntimeError(f"a side-by-side client failed ({c.args})")
        got = {t: json.loads(files[t].read_text()) for t in urls}
        for f in files.values():
            f.unlink()
            Path(f"{f}.ready").unlink()
        if any(g["failed"] for g in got.values()):
            raise RuntimeError(f"failed requests: {got}")
        row = {"round": rnd, "first": order[0], "counts": got, "cpu_s": cpu,
               "ratio": got["traced"]["output_tokens"] / got["direct"]["output_tokens"]}
        print(f"  round {rnd}: plain {got['direct']['requests']} requests, traced {got['traced']['requests']}: "
              f"{row['ratio']:.3f}x", flush=True)
        out.append(row)
    return out


STACKS = {"direct": ("direct", "engine-plain", "core-plain"), "traced": ("traced", "engine-traced", "core-traced")}


def write(path: Path, info: dict, args: argparse.Namespace, rows: list[dict], spans: dict) -> None:
    import statistics

    ratios = [r["ratio"] for r in rows]
    med = statistics.median(ratios)
    (path.with_suffix(".json")).write_text(json.dumps({"machine": info, "args": vars(args), "rounds": rows,
                                                       "receiver": spans, "median_ratio": med}, indent=1))
    md = [f"# Tracing on and off side by side ({path.stem})", "", f"`{info['command']}`", "",
          f"Machine: {info['host_cpus']} CPUs, shared with other agents' work (load average "
          f"{info.get('loadavg', ['?'])[0]}); both stacks loaded at once, so the load falls on both.", "",
          f"Model `{args.model}`, {args.input_len} in / {args.output_len} out, concurrency {args.concurrency} "
          f"on each stack, {args.rounds} windows of {args.window_s:g} s.", "",
          f"**Output throughput, traced over plain: median {med:.3f}x** (rounds: "
          f"{', '.join(f'{x:.3f}' for x in ratios)}; target ≥ 0.97x).", "",
          f"The receiver got {spans.get('spans', 0)} spans in {spans.get('traces', 0)} traces.", "",
          "CPU ms per request finished in the window (gateway, API process, engine process):", "",
          "| round | first client | plain requests | traced requests | ratio (tokens) | plain gw / API / engine "
          "| traced gw / API / engine |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for t in ("direct", "traced"):
            n = max(1, r["counts"][t]["requests"])
            cells.append(" / ".join(f"{1000 * r['cpu_s'][k] / n:.2f}" for k in STACKS[t]))
        md.append(f"| {r['round']} | {r['first'].replace('direct', 'plain')} | {r['counts']['direct']['requests']} "
                  f"| {r['counts']['traced']['requests']} | {r['ratio']:.3f} | {cells[0]} | {cells[1]} |")
    (path.with_suffix(".md")).write_text("\n".join(md + [""]))
    print("\n".join(md))


def main() -> None:
    p = argparse.ArgumentParser(description="a side-by-side client")
    p.add_argument("--url", required=True)
    p.add_argument("--go", required=True, help="a file: the Unix time to start at, once written")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    Path(args.out).write_text(json.dumps(asyncio.run(drive(args))))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
