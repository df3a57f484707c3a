"""Markdown tables and percentiles for the benchmark scripts' results files (no torch)."""

from __future__ import annotations

from typing import Any

from llmserve.percentiles import percentile


def pct(values: list[float], p: float) -> float:
    """The project's percentile (nearest rank: ``llmserve.percentiles``); NaN when empty."""
    return percentile(values, p, empty=float("nan"))


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
