"""What tracing costs (issue 34): the same gateway and engine with tracing off and on.

Two stacks, each an ``llmserve engine`` subprocess (default: the tiny random Llama of
benchmarks/gateway/overhead.py; ``--model SmolLM2-135M-Instruct`` for the real one)
behind an ``llmserve gateway`` subprocess: one plain, one with ``--otlp-endpoint`` on
both, exporting every span to an OTLP/HTTP receiver in a process of its own (it
decodes each export with opentelemetry-proto, as a collector would). The client
drives them with benchmarks/gateway/overhead.py's own two measurements, the stacks
taking turns: ``llmserve bench`` runs (streaming, concurrency 8, the stacks strictly
alternating; TTFT p50 and output tok/s, traced against the plain runs on either side) and paired
single requests (concurrency 1, the two stacks alternating request by request: the
least noisy TTFT difference on a shared machine).

    python benchmarks/tracing/overhead.py [--quick] [--model SmolLM2-135M-Instruct]

Results: ``benchmarks/results/tracing_overhead[-quick].{md,json}``. Targets: TTFT p50
+1 ms or less, throughput 0.97x or more.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gateway"))
sys.path.insert(0, str(ROOT))
import overhead as gw  # noqa: E402 - benchmarks/gateway/overhead.py: processes, bench runs, paired TTFT
import side_by_side  # noqa: E402 - benchmarks/tracing/side_by_side.py: both stacks loaded at once

from llmserve.ports import free_port  # noqa: E402


def receiver_main(port: int, out: str) -> None:
    import signal
    import time

    from tests.tracing.otlp_receiver import Receiver

    done = []
    signal.signal(signal.SIGTERM, lambda *a: done.append(1))
    with Receiver(port) as rx:
        Path(out).write_text("")
        while not done:
            time.sleep(0.2)
        names: dict[str, int] = {}
        for s in rx.spans:
            names[s["name"]] = names.get(s["name"], 0) + 1
        Path(out).write_text(json.dumps({"spans": len(rx.spans), "by_name": names,
                                         "traces": len({s["trace_id"] for s in rx.spans})}))


def engine_core(api_pid: int) -> int:
    """The engine process ``llmserve engine`` forked: its child that has worked most (not,
    say, multiprocessing's resource tracker)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == api_pid:
                kids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    if not kids:
        raise RuntimeError(f"no engine process under {api_pid}")
    return max(kids, key=gw.cpu_s)


# Where the telemetry runs: the gateway and the instance's API process (the engine
# process's share, its span records, is lost in its model steps' noise).
STACK = {"plain": ("direct", "engine-plain"), "traced": ("traced", "engine-traced")}


def serving_cpu(run: dict) -> float:
    """CPU ms per request of the gateway and API process of the stack that served ``run``."""
    return sum(run["cpu_ms_per_request"][k] for k in STACK["plain" if run["target"] == "direct" else "traced"])


def cpu_ratios(runs: list[dict]) -> list[float]:
    """Per round: plain's gateway + API CPU per request over traced's (what a machine
    those two saturate would serve, traced, relative to plain)."""
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["target"]] = serving_cpu(r)
    return [v["direct"] / v["traced"] for v in by_round.values() if v.get("traced")]


def neighbour_ratios(runs: list[dict]) -> list[float]:
    """Traced over plain output tok/s for every two runs next to each other (the stacks
    alternate, so each traced run is compared with the plain run before it and the one
    after it): a slow drift of the machine's load cancels in the pairs' median."""
    tok = [(r["target"], r["output_tok_s"]) for r in runs]
    return [(a[1] / b[1] if a[0] == "traced" else b[1] / a[1])
            for a, b in zip(tok, tok[1:]) if {a[0], b[0]} == {"direct", "traced"}]


def main_run(args: argparse.Namespace) -> None:
    if args.quick:
        args.rounds, args.num_prompts, args.pairs = 2, 16, 30
    name = "tracing_overhead" + ("-quick" if args.quick else "") + (f"-{args.label}" if args.label else "")
    info = gw.machine()
    info["command"] = "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    cache = Path(tempfile.gettempdir()) / "llmserve-gateway-bench"
    cache.mkdir(exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="trace-bench-", dir=cache))
    tokenizer = args.tokenizer
    model_path = str(gw.tiny_model(cache)) if args.model == "tiny" else args.model
    if args.model == "tiny":
        tokenizer = tokenizer or model_path
    rx_port = free_port()
    rx_out = logdir / "receiver.json"
    otlp = f"http://127.0.0.1:{rx_port}"
    procs: list[gw.Proc] = []
    urls: dict[str, str] = {}
    pids: dict[str, int] = {}
    try:
        rx = gw.Proc("receiver", [sys.executable, __file__, "_receiver", "--port", str(rx_port), "--out", str(rx_out)],
                     logdir, f"{otlp}/ready")  # (never 200: waited for by its file below)
        procs.append(rx)
        pids["receiver"] = rx.pid
        traced = [] if args.control else ["--otlp-endpoint", otlp]  # (--control: the method's own bias)
        # --baseline-code DIR: the "plain" slot is that code tree (a git archive), traced too.
        plain = ["--otlp-endpoint", otlp] if args.baseline_code else []
        for stack, extra in (("plain", plain), ("traced", traced)):
            # ``python -m`` imports the package from its working folder: the chosen code tree.
            cwd = Path(args.baseline_code) if args.baseline_code and stack == "plain" else ROOT
            e_port, g_port = free_port(), free_port()
            engine = gw.Proc(f"engine-{stack}", [
                sys.executable, "-m", "llmserve.cli", "engine", "--model", model_path, "--threads", str(args.threads),
                "--port", str(e_port), "--served-model-name", gw.SERVED, "--no-enable-prefix-caching", *extra],
                logdir, f"http://127.0.0.1:{e_port}/ready", cwd=cwd)
            procs.append(engine)
            cfg = logdir / f"gateway-{stack}.yaml"
            cfg.write_text(json.dumps({"models": [{"name": gw.SERVED, "versions": [
                {"name": "v1", "weight": 1, "upstreams": [f"http://127.0.0.1:{e_port}"]}]}]}))
            gateway = gw.Proc(f"gateway-{stack}", [sys.executable, "-m", "llmserve.cli", "gateway", "--config",
                                                   str(cfg), "--port", str(g_port), *extra],
                              logdir, f"http://127.0.0.1:{g_port}/ready", cwd=cwd)
            procs.append(gateway)
            engine.wait_ready()
            gateway.wait_ready()
            # "direct" is overhead.py's name for the baseline the other target is compared with.
            key = "direct" if stack == "plain" else "traced"
            urls[key] = f"http://127.0.0.1:{g_port}/v1"
            pids.update({key: gateway.pid, f"engine-{stack}": engine.pid})  # (a target's own gateway by its name)
            pids[f"core-{stack}"] = engine_core(engine.pid)
        print(f"stacks {urls}; logs {logdir}", flush=True)
        warm = argparse.Namespace(**{**vars(args), "num_prompts": args.concurrency})
        for url in urls.values():
            gw.bench_once(url, warm, tokenizer, args.seed + 1, pids)
        if args.side_by_side:
            print(f"side by side, {args.rounds} windows of {args.window_s:g} s:", flush=True)
            rows = side_by_side.rounds(args, urls, tokenizer, pids, gw.cpu_s, logdir, gw.SERVED)
        else:
            print("bench runs (plain = 'direct'):", flush=True)
            over = gw.overhead(args, urls, tokenizer, pids)
            print(f"TTFT, {args.pairs} single requests per stack taking turns:", flush=True)
            over["paired"] = gw.paired_ttft(args, urls, tokenizer)
    finally:
        for p in reversed(procs):
            p.stop()
    spans = json.loads(rx_out.read_text() or "{}")
    if args.side_by_side:
        info["loadavg"] = os.getloadavg()
        side_by_side.write(gw.RESULTS / name.replace("overhead", "side_by_side"), info, args, rows, spans)
    else:
        write(name, info, args, over, spans)


def write(name: str, info: dict, args: argparse.Namespace, over: dict, spans: dict) -> None:
    med = over["median"]["traced"]
    paired = over["paired"]["targets"]["traced"]
    ratios = cpu_ratios(over["runs"])
    cpu_ratio = gw.median(ratios)
    near = neighbour_ratios(over["runs"])
    throughput = gw.median(near)
    verdict = {"ttft_p50_delta_ms_bench": med["ttft_p50_ms"], "ttft_p50_delta_ms_paired": paired["diff_p50_ms"],
               "throughput_ratio": throughput, "throughput_ratios": near,
               "throughput_ratio_same_round": med["throughput_ratio"], "serving_cpu_ratio": cpu_ratio,
               "serving_cpu_ratios": ratios,
               "meets_ttft_target": paired["diff_p50_ms"] <= 1.0, "meets_throughput_target": throughput >= 0.97}
    out = {"machine": info, "args": vars(args), "overhead": over, "receiver": spans, "verdict": verdict}
    (gw.RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1))
    cpu = ("direct", "traced", "engine-plain", "engine-traced", "core-plain", "core-traced", "receiver")
    rows = [[str(r["round"]), r["target"].replace("direct", "plain"), f"{r['ttft_p50_ms']:.2f}", f"{r['ttft_p99_ms']:.2f}",
             f"{r['itl_p50_ms']:.2f}", f"{r['output_tok_s']:.1f}",
             *(f"{r['cpu_ms_per_request'][k]:.2f}" for k in cpu)] for r in over["runs"]]
    md = [f"# Tracing overhead ({name})", "", f"`{info['command']}`", "",
          f"Machine: {info['host_cpus']} CPUs, shared with other agents' work "
          f"(load avg {over['paired']['loadavg_1min']:.1f} at the paired run): compare within this run only.", "",
          f"Model `{args.model}`, {args.num_prompts} prompts of {args.input_len} in / {args.output_len} out, "
          f"concurrency {args.concurrency}, {args.rounds} rounds; {args.pairs} paired single requests.", "",
          "| figure | traced minus plain | target |", "|---|---|---|",
          f"| TTFT p50, paired single requests (median of differences) | {paired['diff_p50_ms']:+.2f} ms "
          f"(IQR {paired['diff_p25_ms']:+.2f} .. {paired['diff_p75_ms']:+.2f}) | ≤ +1 ms |",
          f"| TTFT p50, bench runs (median over rounds) | {med['ttft_p50_ms']:+.2f} ms | ≤ +1 ms |",
          f"| output throughput (median over neighbouring runs: {', '.join(f'{x:.3f}' for x in near)}) "
          f"| {throughput:.3f}x | ≥ 0.97x |",
          f"| gateway + API process CPU per request, plain over traced (median over rounds: "
          f"{', '.join(f'{x:.3f}' for x in ratios)}) | {cpu_ratio:.3f}x | ≥ 0.97x |",
          f"| gateway CPU per request (traced; plain in the runs below) | {med['gateway_cpu_ms_per_request']:.2f} ms | |",
          "",
          f"The receiver got {spans.get('spans', 0)} spans in {spans.get('traces', 0)} traces: "
          f"{json.dumps(spans.get('by_name', {}))}.", "",
          "CPU ms per request of each process during each run (the idle stack's polls included):", "",
          gw.md_table(["round", "stack", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "out tok/s", "gw plain",
                       "gw traced", "API plain", "API traced", "engine plain", "engine traced", "receiver"], rows),
          "", "(gw: `llmserve gateway`; API: `llmserve engine`'s API process; engine: the engine process it forked.)",
          ""]
    (gw.RESULTS / f"{name}.md").write_text("\n".join(md))
    print("\n".join(md))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role")
    r = sub.add_parser("_receiver", help="internal: the OTLP/HTTP receiver")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--out", required=True)
    p.add_argument("--model", default="tiny")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pairs", type=int, default=100)
    p.add_argument("--paired-output-len", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="2 rounds, 16 prompts, 30 pairs")
    p.add_argument("--side-by-side", action="store_true",
                   help="both stacks loaded at once for --rounds windows (side_by_side.py), instead of in turns")
    p.add_argument("--window-s", type=float, default=20.0, help="with --side-by-side: each window's length")
    p.add_argument("--control", action="store_true", help="the 'traced' stack without tracing: checks the method")
    p.add_argument("--baseline-code", default=None,
                   help="a code tree (git archive) for the 'plain' stack, traced as well: old tracing against new")
    p.add_argument("--label", default=None, help="suffix for the results files (e.g. smollm2)")
    args = p.parse_args()
    if args.role == "_receiver":
        receiver_main(args.port, args.out)
    else:
        main_run(args)


if __name__ == "__main__":
    main()
