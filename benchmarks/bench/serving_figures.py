"""The README's serving figures, measured through HTTP with ``llmserve bench``.

Runs one suite against an already-running OpenAI-compatible server, saves every
run's JSON under ``--out-dir`` and appends one markdown row per run to
``--out-dir/figures.md``. Features that need a server restart (prefix caching,
n-gram speculation) are compared by running the suite once per server setting
with a different ``--label``:

    python benchmarks/bench/serving_figures.py --suite concurrency \\
        --base-url http://127.0.0.1:8000/v1 --tokenizer ~/.cache/llmserve/models/SmolLM2-135M-Instruct/...
    python benchmarks/bench/serving_figures.py --suite shared-prefix --label "prefix cache on" ...
    python benchmarks/bench/serving_figures.py --suite shared-prefix --label "prefix cache off" ...
    python benchmarks/bench/serving_figures.py --suite input-grounded --label "ngram on" ...

Suites (all with ``ignore_eos`` so output lengths are exact):
- ``concurrency``: random 256 in / 128 out at max concurrency 1, 16 and 64.
- ``shared-prefix``: 8 prefixes of 512 tokens, 32-token questions, 64 out, concurrency 16.
- ``input-grounded``: rewrite 256-token passages, 256 out, concurrency 16.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmserve.bench.cli import execute
from llmserve.bench.client import EndpointConfig
from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig
from llmserve.bench.report import render_result, save_result

SUITES: dict[str, list[tuple[str, DatasetConfig, LoadConfig]]] = {
    "concurrency": [
        (f"random 256/128 c={c}", DatasetConfig("random", random_input_len=256, random_output_len=128),
         LoadConfig(num_prompts=max(16, 4 * c), max_concurrency=c))
        for c in (1, 16, 64)
    ],
    "shared-prefix": [
        ("shared-prefix 8x512 + 32, 64 out", DatasetConfig("shared-prefix", num_prefixes=8, prefix_len=512,
                                                          question_len=32, output_len=64),
         LoadConfig(num_prompts=128, max_concurrency=16)),
    ],
    "input-grounded": [
        ("input-grounded rewrite 256/256", DatasetConfig("input-grounded", grounded_input_len=256, output_len=256),
         LoadConfig(num_prompts=64, max_concurrency=16)),
    ],
}

HEADER = ("| run | setting | ok/failed | req/s | out tok/s | mean TTFT ms | p99 TTFT ms "
          "| mean TPOT ms | p99 ITL ms | token counts |\n|---|---|---|---|---|---|---|---|---|---|\n")


def _row(name: str, label: str, result) -> str:
    s = result.summary.to_flat_dict()

    def f(k: str) -> str:
        v = s.get(k)
        return "-" if v is None else f"{v:.1f}"

    counts = "exact" if result.meta["token_counts"].startswith("exact") else "approx"
    return (f"| {name} | {label} | {s['completed']}/{s['failed']} | {s['request_throughput']:.2f} "
            f"| {s['output_throughput']:.1f} | {f('mean_ttft_ms')} | {f('p99_ttft_ms')} "
            f"| {f('mean_tpot_ms')} | {f('p99_itl_ms')} | {counts} |\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None, help="the model's tokenizer (HF folder or .gguf) for exact counts")
    p.add_argument("--label", default="default", help="the server setting this run measures")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--out-dir", default="benchmarks/bench/results")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "figures.md"
    if not table.exists():
        table.write_text(HEADER)
    for name, dataset, load in SUITES[args.suite]:
        dataset.tokenizer = args.tokenizer
        load.seed = args.seed
        cfg = BenchConfig(
            endpoint=EndpointConfig(args.base_url, args.model, args.endpoint, ignore_eos=True),
            dataset=dataset, load=load, percentiles=(50.0, 90.0, 99.0), label=f"{name} [{args.label}]",
        )
        result = execute(cfg)
        render_result(result)
        stem = "".join(ch if ch.isalnum() else "_" for ch in f"{name}_{args.label}").strip("_")
        save_result(result, out / f"{stem}.json")
        with table.open("a") as fh:
            fh.write(_row(name, args.label, result))
    print(f"rows appended to {table}")


if __name__ == "__main__":
    main()
