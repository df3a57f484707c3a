"""``llmserve bench``: flags (named as in ``vllm bench serve``), and the run from flags to report.

The top-level CLI owns the ``llmserve`` command and calls :func:`add_bench_args` on
its ``bench`` sub-parser and :func:`run_bench` with the parsed namespace;
``python -m llmserve.bench`` runs the same thing standalone.

    llmserve bench --base-url http://127.0.0.1:8000/v1 --model M [options]
    llmserve bench compare A.json B.json

Every flag is checked before the server is contacted; then, as ``vllm bench serve``
does, one untimed test request goes first, and a server that is down or refuses it
stops the run with one line (exit 2) naming the URL.
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
from llmserve.bench.client import EndpointConfig, make_http_client, send_request
from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig
from llmserve.bench.metrics import summarize, summarize_by_priority
from llmserve.bench.records import ErrorKind
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
    results = given(BenchConfig, args)
    if results.get("plot") == "":  # --plot without a file
        save = results.get("save_result")
        results["plot"] = str(Path(save).with_suffix(".png")) if save else "bench.png"
    dataset, load = config_from(DatasetConfig, args), config_from(LoadConfig, args)
    # Every flag is checked before the server is asked anything (a bad --num-prompts is a flag
    # error, whether the server is up or not); "-" stands for the model until it is asked.
    cfg = BenchConfig(endpoint=EndpointConfig(**{"model": "-", **endpoint}), dataset=dataset, load=load, **results)
    if not endpoint.get("model"):
        return cfg.model_copy(update={"endpoint": cfg.endpoint.model_copy(
            update={"model": first_served_model(cfg.endpoint)})})
    return cfg


def unreachable(url: str, e: BaseException) -> str:
    """``cannot reach URL: connection refused``: the URL, and the reason without errno noise."""
    reason = getattr(e, "strerror", None) or str(e.__cause__ or e.__context__ or e) or type(e).__name__
    return f"cannot reach {url}: {reason.split('] ')[-1].lower()}"


def first_served_model(endpoint: EndpointConfig) -> str:
    url = endpoint.api_root + "/models"
    try:
        with httpx.Client(trust_env=False, timeout=30) as c:
            resp = c.get(url, headers=endpoint.headers)
    except (httpx.TransportError, OSError) as e:
        raise ValueError(unreachable(url, e)) from None
    if resp.status_code != 200:
        raise ValueError(f"GET {url} answered HTTP {resp.status_code}: {resp.text[:200]}; pass --model")
    try:
        models = resp.json().get("data") or []
    except (ValueError, AttributeError):
        raise ValueError(f"GET {url} answered something that is not a model list; pass --model") from None
    if not models:
        raise ValueError(f"{url} lists no model; pass --model")
    return models[0]["id"]


def initial_test(cfg: BenchConfig, plan: "Plan") -> None:
    """One request before the run, as ``vllm bench serve`` sends: a server that is down or
    refuses the request stops the run with one line, not a table of failures."""
    probe = plan.probe
    assert probe is not None  # (prepare sets it; the fidelity check's plans skip this test)

    async def one():
        async with make_http_client(1) as client:
            return await send_request(client, cfg.endpoint, probe, -1, time.perf_counter())

    rec = asyncio.run(one())
    if rec.success:
        return
    if rec.error_kind is ErrorKind.CONNECTION:
        why = ConnectionError(rec.error.split(": ", 1)[-1])  # the message, not its class name
        raise ValueError(f"{unreachable(cfg.endpoint.url, why)} (the initial test request)")
    raise ValueError(f"the initial test request to {cfg.endpoint.url} failed: {' '.join(rec.error.split())[:300]}")


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
    try:
        cfg = config_from_args(args)
        plan = prepare(cfg)
        initial_test(cfg, plan)
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
