"""Compare policies: a rich table on the terminal, Markdown and JSON for the record."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table

from llmserve.sim.results import Summary

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # header, Summary field, format
    ("policy", "policy", "{}"),
    ("TTFT≤SLO", "ttft_attainment", "{:.2%}"),
    ("e2e≤SLO", "e2e_attainment", "{:.2%}"),
    ("TTFT p50", "ttft_p50_s", "{:.2f}s"),
    ("TTFT p99", "ttft_p99_s", "{:.2f}s"),
    ("e2e p50", "e2e_p50_s", "{:.1f}s"),
    ("e2e p99", "e2e_p99_s", "{:.1f}s"),
    ("inst-hours", "instance_hours", "{:.1f}"),
    ("vs static", "cost_ratio", "{:.1%}"),
    ("cost", "cost_dollars", "${:.1f}"),
    ("spot h", "spot_hours", "{:.1f}"),
    ("reclaims", "reclaims", "{}"),
    ("mean", "mean_instances", "{:.1f}"),
    ("peak", "peak_instances", "{}"),
    ("scale events", "scale_events", "{}"),
    ("lost", "lost", "{}"),
    ("sim wall", "wall_s", "{:.1f}s"),
    ("sim cpu", "cpu_s", "{:.1f}s"),
)


def _row(s: Summary, baseline_hours: float | None) -> list[str]:
    values = s.as_dict()
    values["lost"] = s.rejected + s.expired + s.reclaimed
    values["cost_ratio"] = s.instance_hours / baseline_hours if baseline_hours else math.nan
    out = []
    for _, key, fmt in COLUMNS:
        v = values[key]
        out.append("-" if isinstance(v, float) and math.isnan(v) else fmt.format(v))
    return out


def baseline_hours(summaries: Sequence[Summary], baseline: str = "static") -> float | None:
    """Instance-hours of the first run whose label starts with ``baseline``."""
    for s in summaries:
        if s.policy.startswith(baseline):
            return s.instance_hours
    return None


def comparison_table(summaries: Sequence[Summary], title: str = "") -> Table:
    base = baseline_hours(summaries)
    table = Table(title=title or None)
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="left" if header == "policy" else "right")
    for s in summaries:
        table.add_row(*_row(s, base))
    return table


def print_comparison(summaries: Sequence[Summary], title: str = "", console: Console | None = None) -> None:
    (console or Console()).print(comparison_table(summaries, title))


def markdown_table(summaries: Sequence[Summary]) -> str:
    base = baseline_hours(summaries)
    lines = ["| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|" + "|".join("---" if h == "policy" else "---:" for h, _, _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_row(s, base)) + " |" for s in summaries]
    return "\n".join(lines) + "\n"


def write_summaries(summaries: Sequence[Summary], path: str | Path, extra: dict | None = None) -> None:
    """The comparison as JSON (one object per policy), plus run metadata."""
    doc = {"runs": [s.as_dict() for s in summaries], **(extra or {})}
    Path(path).write_text(json.dumps(doc, indent=2, default=float) + "\n")
