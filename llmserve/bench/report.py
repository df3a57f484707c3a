"""Results out: the end-of-run table, the JSON file, and the side-by-side comparison.

The JSON holds the configuration, every request record and the summary under
vLLM's key names, so a result can be re-analysed, plotted later, or compared with
another run (``llmserve bench compare A.json B.json``) without guessing what was
measured. The summary's keys are also at the top level beside vLLM's run keys
(``date``, ``model_id``, ``request_rate`` ...), where scripts written for
``vllm bench serve --save-result`` files read them.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from llmserve.bench.metrics import LATENCY_METRICS, Summary
from llmserve.bench.records import RequestRecord
from llmserve.bench.server_metrics import cross_check

RESULT_FORMAT = "llmserve-bench/1"
LATENCY_NAMES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st)",
                 "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


@dataclass(slots=True)
class BenchResult:
    config: dict[str, Any]
    summary: Summary
    per_class: dict[str, Summary]
    records: list[RequestRecord]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        c = self.config
        started = self.meta.get("started_at")
        vllm = {  # a vllm bench serve result file's run keys
            "date": None if started is None else time.strftime("%Y%m%d-%H%M%S", time.localtime(started)),
            "backend": c.get("endpoint", {}).get("endpoint"), "label": c.get("label"),
            "model_id": c.get("endpoint", {}).get("model"), "tokenizer_id": c.get("dataset", {}).get("tokenizer"),
            "num_prompts": c.get("load", {}).get("num_prompts"), "request_rate": c.get("load", {}).get("request_rate"),
            "burstiness": c.get("load", {}).get("burstiness"),
            "max_concurrency": c.get("load", {}).get("max_concurrency")}
        return {
            **vllm,
            **self.summary.to_flat_dict(),
            "format": RESULT_FORMAT,
            "meta": self.meta,
            "config": self.config,
            "summary": self.summary.to_flat_dict(),
            "per_class": {c: s.to_flat_dict() for c, s in self.per_class.items()},
            "requests": [r.to_dict() for r in self.records],
        }


def save_result(result: BenchResult, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(_json_safe(result.to_json()), f, indent=1, allow_nan=False)


def load_result(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or "summary" not in data:
        raise ValueError(f"{path} is not an llmserve bench result (no 'summary')")
    return data


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def summary_table(s: Summary, title: str, metrics: Any = LATENCY_METRICS) -> Table:
    d = s.to_flat_dict()
    t = Table(title=title, show_header=False, min_width=56)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("Successful requests", _fmt(s.completed))
    t.add_row("Failed requests", _fmt(s.failed), style="bold red" if s.failed else None)
    for kind, n in s.failures_by_kind.items():
        t.add_row(f"  failed: {kind}", _fmt(n), style="red")
    t.add_row("Benchmark duration (s)", _fmt(s.duration_s))
    t.add_row("Total input tokens", _fmt(s.total_input_tokens))
    if s.server_prompt_tokens is not None:
        t.add_row("Total input tokens (server usage)", _fmt(s.server_prompt_tokens))
    t.add_row("Total generated tokens", _fmt(s.total_output_tokens))
    t.add_row("Request throughput (req/s)", _fmt(s.request_throughput))
    if s.request_goodput is not None:
        t.add_row("Request goodput (req/s)", _fmt(s.request_goodput))
    t.add_row("Output token throughput (tok/s)", _fmt(s.output_throughput))
    t.add_row("Peak output token throughput (tok/s)", _fmt(s.max_output_tokens_per_s))
    t.add_row("Peak requests in flight", _fmt(s.max_in_flight))
    t.add_row("Peak concurrent requests (vLLM, 1 s buckets)", _fmt(s.max_concurrent_requests))
    t.add_row("Total token throughput (tok/s)", _fmt(s.total_token_throughput))
    for name, label in LATENCY_NAMES.items():
        if name not in metrics:  # --percentile-metrics
            continue
        t.add_section()
        t.add_row(f"[bold]{label}[/bold]", "")
        upper = name.upper()
        t.add_row(f"Mean {upper} (ms)", _fmt(d[f"mean_{name}_ms"]))
        t.add_row(f"Median {upper} (ms)", _fmt(d[f"median_{name}_ms"]))
        for key in getattr(s, name).percentiles_ms:
            t.add_row(f"{key.upper()} {upper} (ms)", _fmt(d[f"{key}_{name}_ms"]))
    return t


def class_table(per_class: dict[str, Summary]) -> Table:
    t = Table(title="Per priority class (latencies in ms)")
    t.add_column("class", no_wrap=True)
    for col in ("ok", "failed", "tok/s", "good/s", "TTFT", "p99 TTFT", "TPOT", "p99 E2EL"):
        t.add_column(col, justify="right", no_wrap=True)
    for c, s in per_class.items():
        d = s.to_flat_dict()
        t.add_row(c, _fmt(s.completed), _fmt(s.failed), _fmt(s.output_throughput), _fmt(s.request_goodput),
                  _fmt(d["mean_ttft_ms"]), _fmt(d.get("p99_ttft_ms")), _fmt(d["mean_tpot_ms"]),
                  _fmt(d.get("p99_e2el_ms")))
    return t


def server_check_table(server: dict[str, Any], s: Summary) -> Table | str:
    if not server["deltas"]:
        return f"[yellow]No server counters read from {server['url']}[/yellow]"
    t = Table(title=f"Server counters over the run ({server['url']})")
    t.add_column("counter")
    t.add_column("server", justify="right")
    t.add_column("bench", justify="right")
    for name, theirs, ours in cross_check(server["deltas"], s):
        match = ours is not None and abs(theirs - ours) < 0.5
        t.add_row(name, _fmt(int(theirs)), _fmt(ours), style=None if match else "yellow")
    return t


def render_result(result: BenchResult, console: Console | None = None) -> None:
    console = console or Console()
    counts = result.meta.get("token_counts", "")
    metrics = result.config.get("percentile_metrics") or LATENCY_METRICS
    console.print(summary_table(result.summary, "Serving Benchmark Result", metrics))
    if len(result.per_class) > 1:
        console.print(class_table(result.per_class))
    if counts.startswith("approximate"):
        console.print(f"[yellow]Input token counts are {counts}[/yellow]")
    sources = result.summary.output_sources
    if any(k != "usage" for k in sources):
        console.print(f"[yellow]Output tokens not all from the server's usage field: {sources}[/yellow]")
    server = result.meta.get("server_metrics")
    if server is not None:
        console.print(server_check_table(server, result.summary))
    first_failure = next((r for r in result.records if not r.success), None)
    if first_failure is not None:
        console.print(f"[red]First failure (request {first_failure.index}): {first_failure.error[:300]}[/red]")


# --- compare -----------------------------------------------------------------------

COMPARE_KEYS = (
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s",
)


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any, float | None]]:
    """(metric, A, B, B/A) for every headline and latency metric either summary has."""
    sa, sb = a["summary"], b["summary"]
    keys = list(COMPARE_KEYS)
    for name in LATENCY_NAMES:
        keys += [k for k in sa if k.endswith(f"_{name}_ms") and not k.startswith("std_")]
        keys += [k for k in sb if k.endswith(f"_{name}_ms") and not k.startswith("std_") and k not in keys]
    rows = []
    for k in dict.fromkeys(keys):
        va, vb = sa.get(k), sb.get(k)
        if va is None and vb is None:
            continue
        ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
        rows.append((k, va, vb, ratio))
    return rows


def render_compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str], console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title="Benchmark comparison (ratio = B / A)")
    t.add_column("metric")
    t.add_column(f"A: {names[0]}", justify="right")
    t.add_column(f"B: {names[1]}", justify="right")
    t.add_column("B / A", justify="right")
    for k, va, vb, ratio in compare_rows(a, b):
        t.add_row(k, _fmt(va), _fmt(vb), "-" if ratio is None else f"{ratio:.3f}")
    console.print(t)
    for label, data in zip("AB", (a, b)):
        fails = data["summary"].get("failures_by_kind") or {}
        if fails:
            console.print(f"[red]{label} failures: {fails}[/red]")
    ca, cb = a.get("config", {}), b.get("config", {})
    for section in ("dataset", "load"):
        diff = {k: (ca.get(section, {}).get(k), cb.get(section, {}).get(k))
                for k in set(ca.get(section, {})) | set(cb.get(section, {}))
                if ca.get(section, {}).get(k) != cb.get(section, {}).get(k)}
        if diff:
            console.print(f"[yellow]{section} config differs (A, B): {diff}[/yellow]")
