"""The tracing benchmark's method (benchmarks/tracing/overhead.py): runs in an order where
each follows the other stack's, and the throughput ratio read from neighbouring runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(ROOT / "benchmarks" / "tracing"))  # (its side_by_side)
GW = _load("gateway_overhead", ROOT / "benchmarks" / "gateway" / "overhead.py")
TR = _load("tracing_overhead", ROOT / "benchmarks" / "tracing" / "overhead.py")


def _sequence(targets: list[str], rounds: int) -> list[str]:
    return [t for r in range(rounds) for t in GW.run_order(targets, r)]


def test_no_target_runs_twice_in_a_row():
    for targets in (["direct", "traced"], ["direct", "gateway", "baseline"]):
        seq = _sequence(targets, 6)
        assert all(a != b for a, b in zip(seq, seq[1:])), seq
        assert sorted(seq) == sorted(targets * 6)


def test_the_ratio_pairs_each_traced_run_with_the_plain_runs_beside_it():
    def run(target: str, tok_s: float) -> dict:
        return {"target": target, "output_tok_s": tok_s}

    # tracing costs 5 %; the machine slows by 2 % a run: each traced run is read against the
    # plain run before it (a 2 % faster machine) and after it (2 % slower), so the drift
    # cancels between neighbouring ratios
    runs = [run(t, 100 * 0.98 ** i * (0.95 if t == "traced" else 1.0))
            for i, t in enumerate(_sequence(["direct", "traced"], 4))]
    ratios = TR.neighbour_ratios(runs)
    assert len(ratios) == 7
    assert all(abs(a * b - 0.95 ** 2) < 1e-9 for a, b in zip(ratios, ratios[1:]))
    assert {round(r, 4) for r in ratios} == {round(0.95 * 0.98, 4), round(0.95 / 0.98, 4)}
