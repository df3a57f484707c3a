"""``llmserve bench``: flags (named as in ``vllm bench serve``), and the run from flags to report.

The top-level CLI owns the ``llmserve`` command and calls :func:`add_bench_args` on
its ``bench`` sub-parser and :func:`run_bench` with the parsed namespace;
``python -m llmserve.bench`` runs the same thing standalone.

    llmserve bench --base-url http://127.0.0.1:8000/v1 --model M [options]
    llmserve bench compare A.json B.json
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from llmserve.bench import datasets
from llmserve.bench.arrivals import load_rate_trace, plan_arrivals
from llmserve.bench.client import ENDPOINT_PATHS, EndpointConfig
from llmserve.bench.config import DATASET_NAMES, BenchConfig, DatasetConfig, LoadConfig
from llmserve.bench.metrics import SLO, summarize, summarize_by_priority
from llmserve.bench.report import BenchResult, load_result, render_compare, render_result, save_result
from llmserve.bench.runner import run_requests
from llmserve.bench.server_metrics import default_metrics_url
from llmserve.bench.tokenizer import Tokenizer, load_tokenizer


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """Add the bench flags, and the ``compare A.json B.json`` sub-command, to ``parser``."""
    g = parser.add_argument_group("target")
    g.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="API root, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--model", default=None, help="model name to send (default: the first of GET /v1/models)")
    g.add_argument("--endpoint", choices=sorted(ENDPOINT_PATHS), default="completions")
    g.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    g.add_argument("--ignore-eos", action="store_true", help="send ignore_eos so output lengths are exact")
    g.add_argument("--timeout", type=float, default=600.0, help="per-request limit in seconds")

    g = parser.add_argument_group("load")
    g.add_argument("--num-prompts", type=int, default=1000)
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests/s; inf (default) sends all at once, else Poisson/gamma arrivals")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps: 1 Poisson, <1 burstier, >1 more regular")
    g.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    g.add_argument("--rate-trace", default=None, metavar="CSV",
                   help="rate over time (rows 'time_s,rate', linear between rows); replaces --request-rate")
    g.add_argument("--num-warmups", type=int, default=0, help="requests sent first and not counted")
    g.add_argument("--seed", type=int, default=0)

    g = parser.add_argument_group("dataset")
    g.add_argument("--dataset-name", choices=DATASET_NAMES, default="random")
    g.add_argument("--dataset-path", default=None, help="jsonl prompts, or the source text for input-grounded")
    g.add_argument("--tokenizer", default=None,
                   help="the model's tokenizer (HF folder or .gguf file) for exact token counts")
    g.add_argument("--random-input-len", type=int, default=1024)
    g.add_argument("--random-output-len", type=int, default=128)
    g.add_argument("--random-range-ratio", type=float, default=0.0)
    g.add_argument("--output-len", type=int, default=128,
                   help="max_tokens for shared-prefix, multi-turn, input-grounded and jsonl")
    g.add_argument("--num-prefixes", type=int, default=10, help="shared-prefix: distinct system prompts")
    g.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: tokens per system prompt")
    g.add_argument("--question-len", type=int, default=32, help="shared-prefix: tokens per question")
    g.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation")
    g.add_argument("--turn-user-len", type=int, default=64, help="multi-turn: tokens per user turn")
    g.add_argument("--grounded-input-len", type=int, default=512, help="input-grounded: passage tokens")
    g.add_argument("--grounded-task", choices=sorted(datasets.GROUNDED_INSTRUCTIONS), default="rewrite")
    g.add_argument("--batch-share", type=float, default=0.0,
                   help="share of requests sent with \"priority\": \"batch\"")

    g = parser.add_argument_group("results")
    g.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000")
    g.add_argument("--metric-percentiles", default="90,99", help="comma-separated, e.g. 50,90,99,99.9")
    g.add_argument("--save-result", default=None, metavar="FILE", help="write config, requests and summary as JSON")
    g.add_argument("--plot", nargs="?", const="", default=None, metavar="PNG",
                   help="write a PNG (default: beside --save-result, else bench.png)")
    g.add_argument("--server-metrics", nargs="?", const="", default=None, metavar="URL",
                   help="read the server's /metrics counters before and after the run and show them "
                        "beside the bench's counts (default URL: the base URL's /metrics)")
    g.add_argument("--label", default=None, help="a name for this run in results and comparisons")
    g.add_argument("--disable-tqdm", action="store_true")

    sub = parser.add_subparsers(dest="bench_command", required=False, metavar="{compare}")
    cmp_parser = sub.add_parser("compare", help="print two saved results side by side with ratios")
    cmp_parser.add_argument("result_a")
    cmp_parser.add_argument("result_b")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Validate the flags into a typed configuration (raises ValueError on bad values)."""
    model = args.model or first_served_model(args.base_url, args.api_key)
    plot = args.plot
    if plot == "":
        plot = str(Path(args.save_result).with_suffix(".png")) if args.save_result else "bench.png"
    return BenchConfig(
        endpoint=EndpointConfig(args.base_url, model, args.endpoint, args.api_key, args.ignore_eos, args.timeout),
        dataset=DatasetConfig(
            args.dataset_name, args.dataset_path, args.tokenizer, args.output_len,
            args.random_input_len, args.random_output_len, args.random_range_ratio,
            args.num_prefixes, args.prefix_len, args.question_len, args.turns, args.turn_user_len,
            args.grounded_input_len, args.grounded_task, args.batch_share,
        ),
        load=LoadConfig(args.num_prompts, args.request_rate, args.burstiness, args.max_concurrency,
                        args.rate_trace, args.num_warmups, args.seed),
        percentiles=tuple(float(p) for p in args.metric_percentiles.split(",") if p.strip()),
        slo=SLO.parse(args.goodput),
        save_result=args.save_result,
        plot=plot,
        show_progress=not args.disable_tqdm,
        label=args.label,
        server_metrics=args.server_metrics,
    )


def first_served_model(base_url: str, api_key: str | None) -> str:
    url = EndpointConfig(base_url, "-").api_root
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(trust_env=False, timeout=30) as c:
        resp = c.get(url + "/models", headers=headers)
        resp.raise_for_status()
        models = resp.json().get("data") or []
    if not models:
        raise ValueError(f"{url}/models lists no model; pass --model")
    return models[0]["id"]


def build_requests(cfg: DatasetConfig, tok: Tokenizer, n: int, seed: int) -> list[datasets.SampleRequest]:
    """The dataset named in ``cfg``, with the batch share applied."""
    if cfg.name == "random":
        reqs = datasets.random_dataset(tok, n, cfg.random_input_len, cfg.random_output_len,
                                       cfg.random_range_ratio, seed)
    elif cfg.name == "shared-prefix":
        reqs = datasets.shared_prefix_dataset(tok, n, cfg.num_prefixes, cfg.prefix_len, cfg.question_len,
                                              cfg.output_len, seed)
    elif cfg.name == "multi-turn":
        reqs = datasets.multi_turn_dataset(tok, n, cfg.turns, cfg.turn_user_len, cfg.output_len, seed)
    elif cfg.name == "input-grounded":
        source = Path(cfg.path).read_text() if cfg.path else None
        reqs = datasets.input_grounded_dataset(tok, n, cfg.grounded_input_len, cfg.output_len,
                                               cfg.grounded_task, source, seed)
    else:
        assert cfg.path is not None
        reqs = datasets.jsonl_dataset(tok, cfg.path, n, cfg.output_len)
    datasets.assign_batch_share(reqs, cfg.batch_share, seed)
    return reqs


WARMUP_SEED_OFFSET = 1_000_003


@dataclass(slots=True)
class Plan:
    """Everything decided before the first request: the data and when each is sent."""

    tokenizer: Tokenizer
    requests: list[datasets.SampleRequest]
    offsets: list[float]
    warmups: list[datasets.SampleRequest]


def prepare(cfg: BenchConfig) -> Plan:
    """Load the tokenizer, generate the dataset, plan the arrivals (no traffic)."""
    tok = load_tokenizer(cfg.dataset.tokenizer)
    requests = build_requests(cfg.dataset, tok, cfg.load.num_prompts, cfg.load.seed)
    trace = load_rate_trace(cfg.load.rate_trace) if cfg.load.rate_trace else None
    offsets = plan_arrivals(len(requests), cfg.load.request_rate, cfg.load.burstiness, cfg.load.seed, trace)
    # Warm-ups come from another seed, so no measured prompt is in the prefix cache
    # because of them (vLLM's bench warms up with copies of the first prompt).
    warmups = build_requests(cfg.dataset, tok, cfg.load.num_warmups, cfg.load.seed + WARMUP_SEED_OFFSET)
    return Plan(tok, requests, offsets.tolist(), warmups)


def execute(cfg: BenchConfig, plan: Plan | None = None) -> BenchResult:
    """Run the plan (prepared here when not given) and summarise; no printing or files."""
    plan = plan or prepare(cfg)
    metrics_url = None
    if cfg.server_metrics is not None:
        metrics_url = cfg.server_metrics or default_metrics_url(cfg.endpoint.api_root)
    started = time.time()
    outcome = asyncio.run(run_requests(cfg.endpoint, plan.requests, plan.offsets, cfg.load.max_concurrency,
                                       plan.warmups, plan.tokenizer, cfg.show_progress, metrics_url))
    summary = summarize(outcome.records, outcome.duration_s, cfg.percentiles, cfg.slo)
    per_class = summarize_by_priority(outcome.records, outcome.duration_s, cfg.percentiles, cfg.slo)
    meta: dict[str, Any] = {
        "label": cfg.label,
        "started_at": started,
        "origin_wall": outcome.origin_wall,  # wall time of the offsets' zero (after the client's set-up)
        "token_counts": plan.tokenizer.description,
        "requests_planned": len(plan.requests),
        "requests_sent": len(outcome.records),
        "warmups": {"sent": len(outcome.warmup_records),
                    "failed": sum(not r.success for r in outcome.warmup_records)},
    }
    if metrics_url:
        meta["server_metrics"] = {"url": metrics_url, "deltas": outcome.server_deltas}
    return BenchResult(cfg.to_dict(), summary, per_class, outcome.records, meta)


def run_bench(args: argparse.Namespace) -> int:
    """Entry point for ``llmserve bench``; returns the exit code (1 when nothing succeeded)."""
    if getattr(args, "bench_command", None) == "compare":
        return run_compare(args)
    console = Console()
    try:
        cfg = config_from_args(args)
        plan = prepare(cfg)
    except (ValueError, OSError, httpx.HTTPError) as e:
        console.print(f"[red]llmserve bench: {e}[/red]")
        return 2
    console.print(f"Sending {len(plan.offsets)} requests to {cfg.endpoint.url} (model {cfg.endpoint.model}); "
                  f"token counts {plan.tokenizer.description}")
    result = execute(cfg, plan)
    if result.meta["warmups"]["failed"]:
        console.print(f"[yellow]warm-up: {result.meta['warmups']['failed']} of "
                      f"{result.meta['warmups']['sent']} failed[/yellow]")
    render_result(result, console)
    if cfg.save_result:
        save_result(result, cfg.save_result)
        console.print(f"Saved {cfg.save_result}")
    if cfg.plot:
        from llmserve.bench.plot import plot_result

        plot_result(result.records, cfg.plot, cfg.label or cfg.dataset.name)
        console.print(f"Plotted {cfg.plot}")
    return 0 if result.summary.completed else 1


def run_compare(args: argparse.Namespace) -> int:
    """Entry point for ``llmserve bench compare A.json B.json``."""
    a, b = load_result(args.result_a), load_result(args.result_b)
    names = tuple((d.get("meta", {}).get("label") or p) for d, p in ((a, args.result_a), (b, args.result_b)))
    render_compare(a, b, names)  # type: ignore[arg-type]
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmserve bench", description=__doc__.splitlines()[0])
    add_bench_args(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
