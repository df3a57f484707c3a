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
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape

from llmserve.bench import datasets
from llmserve.bench.arrivals import load_rate_trace, plan_arrivals
from llmserve.bench.client import EndpointConfig
from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig
from llmserve.bench.metrics import summarize, summarize_by_priority
from llmserve.bench.report import BenchResult, load_result, render_compare, render_result, save_result
from llmserve.bench.runner import run_requests
from llmserve.bench.server_metrics import default_metrics_url
from llmserve.bench.tokenizer import Tokenizer, load_tokenizer
from llmserve.flags import add_flags, config_from, flag_error, given


# The flag groups, in the help's order; every flag is generated from its model's fields.
FLAG_GROUPS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("target", EndpointConfig), ("load", LoadConfig), ("dataset", DatasetConfig), ("results", BenchConfig))


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """Add the bench flags, and the ``compare A.json B.json`` sub-command, to ``parser``."""
    for title, model in FLAG_GROUPS:
        add_flags(parser.add_argument_group(title), model)
    sub = parser.add_subparsers(dest="bench_command", required=False, metavar="{compare}")
    cmp_parser = sub.add_parser("compare", help="print two saved results side by side with ratios")
    cmp_parser.add_argument("result_a")
    cmp_parser.add_argument("result_b")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Validate the flags into a typed configuration (raises ValueError on bad values)."""
    endpoint = given(EndpointConfig, args)
    if not endpoint.get("model"):
        endpoint["model"] = first_served_model(EndpointConfig(**{**endpoint, "model": "-"}))  # URL checked first
    results = given(BenchConfig, args)
    if results.get("plot") == "":  # --plot without a file
        save = results.get("save_result")
        results["plot"] = str(Path(save).with_suffix(".png")) if save else "bench.png"
    return BenchConfig(endpoint=EndpointConfig(**endpoint), dataset=config_from(DatasetConfig, args),
                       load=config_from(LoadConfig, args), **results)


def first_served_model(endpoint: EndpointConfig) -> str:
    url = endpoint.api_root
    with httpx.Client(trust_env=False, timeout=30) as c:
        resp = c.get(url + "/models", headers=endpoint.headers)
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
        why = flag_error(e, *(m for _, m in FLAG_GROUPS)) if isinstance(e, ValidationError) else str(e)
        console.print(f"[red]llmserve bench: {escape(why)}[/red]", soft_wrap=True)  # one line, however long
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
