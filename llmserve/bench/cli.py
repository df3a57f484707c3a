"""``llmserve bench``: flags (named as in ``vllm bench serve``), and the run from flags to report.

The top-level CLI owns the ``llmserve`` command and calls :func:`add_bench_args` on
its ``bench`` sub-parser and :func:`run_bench` with the parsed namespace;
``python -m llmserve.bench`` runs the same thing standalone.

    llmserve bench --base-url http://127.0.0.1:8000/v1 --model M [options]
    llmserve bench compare A.json B.json

Every flag is checked before the server is contacted; then, as ``vllm bench serve``
does, one untimed test request goes first: a server still starting is waited for
(``ready.py``), one that stays down or refuses the request stops the run with one line
(exit 2) naming the URL. vLLM's other spellings of the flags work too (``vllm_flags.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, replace
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
from llmserve.bench.ready import first_served_model, initial_test
from llmserve.bench.report import BenchResult, load_result, render_compare, render_result, save_result
from llmserve.bench.runner import run_requests
from llmserve.bench.server_metrics import default_metrics_url
from llmserve.bench.tokenizer import Tokenizer, load_tokenizer
from llmserve.bench.vllm_flags import add_vllm_flags, fold, result_path
from llmserve.flags import add_flags, config_from, flag_error, given


# The flag groups, in the help's order; every flag is generated from its model's fields.
FLAG_GROUPS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("target", EndpointConfig), ("load", LoadConfig), ("dataset", DatasetConfig), ("results", BenchConfig))


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """Add the bench flags, and the ``compare A.json B.json`` sub-command, to ``parser``."""
    for title, model in FLAG_GROUPS:
        add_flags(parser.add_argument_group(title), model)
    add_vllm_flags(parser)
    sub = parser.add_subparsers(dest="bench_command", required=False, metavar="{compare}")
    # A word where the sub-command goes that is not one was left by a flag bench does not have
    # (``--bogus 3``): say so, not argparse's "invalid choice: '3' (choose from 'compare')".
    say = parser.error

    def error(message: str) -> None:
        word = message.partition("argument {compare}: invalid choice: ")[2].rpartition(" (choose from")[0]
        word = word.strip("'")
        say(f"unrecognized arguments: {word} (the value of an unknown flag? see --help)"
            if word else message)

    parser.error = error  # type: ignore[method-assign]
    cmp_parser = sub.add_parser("compare", help="print two saved results side by side with ratios")
    cmp_parser.add_argument("result_a")
    cmp_parser.add_argument("result_b")


def config_from_args(args: argparse.Namespace, say=None) -> BenchConfig:
    """Validate the flags into a typed configuration (raises ValueError on bad values).
    ``say``: where a line about waiting for the server goes."""
    fold(args)  # vLLM's spellings
    endpoint = given(EndpointConfig, args)
    results = given(BenchConfig, args)
    dataset, load = config_from(DatasetConfig, args), config_from(LoadConfig, args)
    # Every flag is checked before the server is asked anything (a bad --num-prompts is a flag
    # error, whether the server is up or not); "-" stands for the model until it is asked.
    cfg = BenchConfig(endpoint=EndpointConfig(**{"model": "-", **endpoint}), dataset=dataset, load=load, **results)
    if not endpoint.get("model"):
        cfg = cfg.model_copy(update={"endpoint": cfg.endpoint.model_copy(
            update={"model": first_served_model(cfg.endpoint, say)})})
    files: dict[str, str] = {}
    if cfg.save_result == "":  # bare --save-result (or --result-dir): vLLM's naming
        files["save_result"] = result_path(args, cfg)
    if cfg.plot == "":  # --plot without a file
        save = files.get("save_result", cfg.save_result)
        files["plot"] = str(Path(save).with_suffix(".png")) if save else "bench.png"
    return cfg.model_copy(update=files)


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
    elif cfg.name == "sharegpt":
        assert cfg.path is not None
        reqs = datasets.sharegpt_dataset(tok, cfg.path, n, cfg.sharegpt_output_len, seed)
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
    probe: datasets.SampleRequest | None = None  # the initial test request: from the warm-up seed, untimed


def prepare(cfg: BenchConfig) -> Plan:
    """Load the tokenizer, generate the dataset, plan the arrivals (no traffic)."""
    tok = load_tokenizer(cfg.dataset.tokenizer)
    requests = build_requests(cfg.dataset, tok, cfg.load.num_prompts, cfg.load.seed)
    trace = load_rate_trace(cfg.load.rate_trace) if cfg.load.rate_trace else None
    offsets = plan_arrivals(len(requests), cfg.load.request_rate, cfg.load.burstiness, cfg.load.seed, trace)
    # Warm-ups come from another seed, so no measured prompt is in the prefix cache
    # because of them (vLLM's bench warms up with copies of the first prompt).
    warmups = build_requests(cfg.dataset, tok, cfg.load.num_warmups, cfg.load.seed + WARMUP_SEED_OFFSET)
    probe = (warmups or build_requests(cfg.dataset, tok, 1, cfg.load.seed + WARMUP_SEED_OFFSET))[0]
    return Plan(tok, requests, offsets.tolist(), warmups, replace(probe, depends_on=None))


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
    say = console.print
    began = time.monotonic()  # one --ready-check-timeout-sec for the model list's wait and the test request's
    try:
        cfg = config_from_args(args, say)
        plan = prepare(cfg)
        assert plan.probe is not None
        initial_test(cfg.endpoint, plan.probe, say, since=began)
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
