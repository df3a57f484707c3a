"""The README's serving figures, measured through HTTP with ``llmserve bench``.

Each suite is a list of bench runs and the server settings to compare. With
``--launch MODEL`` the script starts ``llmserve engine`` once per setting on a free
loopback port (prefix caching on/off, n-gram speculation on/off), runs the suite
and stops it; with ``--base-url`` it measures an already-running server (then run it
once per setting yourself, with ``--label``). Every run's JSON goes to
``--out-dir`` and one markdown row per run is appended to ``--out-dir/figures.md``.

    python benchmarks/bench/serving_figures.py --launch SmolLM2-135M-Instruct \\
        --tokenizer ~/.cache/llmserve/models/converted/<hash> --suite all
    python benchmarks/bench/serving_figures.py --base-url http://127.0.0.1:8000/v1 \\
        --model M --suite concurrency --label "vllm 0.x"

Suites (all with ``ignore_eos`` so output lengths are exact; ``--scale`` shrinks the
number of prompts for slow machines):
- ``concurrency``: random 256 in / 128 out at max concurrency 1, 16 and 64.
- ``shared-prefix``: 8 prefixes of 512 tokens, 32-token questions, 64 out,
  concurrency 16; prefix caching on vs off.
- ``input-grounded``: rewrite 256-token passages, 256 out, concurrency 16;
  n-gram speculation off vs on.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from llmserve.autoscale.providers.process import terminate
from llmserve.bench.cli import execute
from llmserve.bench.ready import first_served_model
from llmserve.bench.client import EndpointConfig
from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig
from llmserve.bench.report import BenchResult, render_result, save_result

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4})


@dataclass(frozen=True)
class Suite:
    runs: list[tuple[str, DatasetConfig, LoadConfig]]
    settings: list[tuple[str, list[str]]]  # (label, extra `llmserve engine` flags)


SUITES: dict[str, Suite] = {
    "concurrency": Suite(
        [(f"random 256/128 c={c}", DatasetConfig(name="random", random_input_len=256, random_output_len=128),
          LoadConfig(num_prompts=max(16, 4 * c), max_concurrency=c)) for c in (1, 16, 64)],
        [("default", [])],
    ),
    "shared-prefix": Suite(
        [("shared-prefix 8x512+32, 64 out", DatasetConfig(name="shared-prefix", num_prefixes=8, prefix_len=512,
                                                         question_len=32, output_len=64),
          LoadConfig(num_prompts=128, max_concurrency=16))],
        [("prefix caching on", ["--enable-prefix-caching"]), ("prefix caching off", ["--no-enable-prefix-caching"])],
    ),
    "input-grounded": Suite(
        [("input-grounded rewrite 256/256",
          DatasetConfig(name="input-grounded", grounded_input_len=256, output_len=256),
          LoadConfig(num_prompts=64, max_concurrency=16))],
        [("no speculation", []), ("ngram k=4", ["--speculative-config", NGRAM])],
    ),
}

HEADER = ("| run | setting | ok/failed | req/s | out tok/s | mean TTFT ms | p99 TTFT ms "
          "| mean TPOT ms | p99 ITL ms | token counts |\n|---|---|---|---|---|---|---|---|---|---|\n")


def _row(name: str, label: str, result: BenchResult) -> str:
    s = result.summary.to_flat_dict()

    def f(k: str) -> str:
        v = s.get(k)
        return "-" if v is None else f"{v:.1f}"

    counts = "exact" if result.meta["token_counts"].startswith("exact") else "approx"
    return (f"| {name} | {label} | {s['completed']}/{s['failed']} | {s['request_throughput']:.2f} "
            f"| {s['output_throughput']:.1f} | {f('mean_ttft_ms')} | {f('p99_ttft_ms')} "
            f"| {f('mean_tpot_ms')} | {f('p99_itl_ms')} | {counts} |\n")


class Engine:
    """An ``llmserve engine`` subprocess on a free 127.0.0.1 port, until the block ends."""

    def __init__(self, model: str, flags: list[str], log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "llmserve.cli", "engine", "--model", model, "--host", "127.0.0.1",
               "--port", str(self.port), "--served-model-name", "bench", *flags]
        self.log = log
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Engine:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited ({self.proc.returncode}); see {self.log}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=1.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"engine not ready after 600 s; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        terminate(self.proc, 30.0)


def run_suite(name: str, base_url: str, model: str, label: str, args: argparse.Namespace, table: Path) -> None:
    for i, (run_name, dataset, load) in enumerate(SUITES[name].runs):
        # A new seed per run: a run repeating an earlier run's prompts on the same
        # server would find them in its prefix cache.
        load = load.model_copy(update={"seed": args.seed + i,
                                       "num_prompts": max(1, round(load.num_prompts * args.scale))})
        cfg = BenchConfig(
            endpoint=EndpointConfig(base_url=base_url, model=model, endpoint=args.endpoint, ignore_eos=True),
            dataset=dataset.model_copy(update={"tokenizer": args.tokenizer}), load=load, percentiles=(50.0, 90.0, 99.0),
            label=f"{run_name} [{label}]", server_metrics="",
        )
        result = execute(cfg)
        render_result(result)
        stem = "".join(ch if ch.isalnum() else "_" for ch in f"{run_name}_{label}").strip("_")
        save_result(result, Path(args.out_dir) / f"{stem}.json")
        with table.open("a") as fh:
            fh.write(_row(run_name, label, result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=[*SUITES, "all"], required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--launch", metavar="MODEL", help="start `llmserve engine --model MODEL` per setting")
    where.add_argument("--base-url", help="measure this running server instead")
    p.add_argument("--model", default=None, help="model name to send (with --base-url)")
    p.add_argument("--engine-args", default="", help="extra flags for every launched engine, one string")
    p.add_argument("--tokenizer", default=None, help="the model's tokenizer (HF folder or .gguf) for exact counts")
    p.add_argument("--label", default="default", help="with --base-url: the server setting measured")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every run's number of prompts")
    p.add_argument("--out-dir", default="benchmarks/bench/results")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "figures.md"
    if not table.exists():
        table.write_text(HEADER)
    for name in SUITES if args.suite == "all" else [args.suite]:
        if args.base_url:
            model = args.model or first_served_model(EndpointConfig(base_url=args.base_url, model="-"))
            run_suite(name, args.base_url, model, args.label, args, table)
            continue
        for label, flags in SUITES[name].settings:
            log = out / f"engine-{name}-{label.replace(' ', '_')}.log"
            with Engine(args.launch, [*args.engine_args.split(), *flags], log) as eng:
                run_suite(name, eng.base_url, "bench", label, args, table)
    print(f"rows appended to {table}")


if __name__ == "__main__":
    main()
