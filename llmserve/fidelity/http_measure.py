"""Measure an instance as a client sees it: through ``llmserve serve``'s HTTP path.

The in-process step model (:func:`llmserve.engine.calibration.measure_steps`)
times the engine alone; a client's TTFT and TPOT also hold the gateway, the API
process (HTTP, tokenising, SSE), the hop to the engine process and the cores
those share. So the serve config's own pool is started (a fixed one: the static
policy at one instance), and bursts of ``n`` simultaneous streaming requests of
``p`` prompt and ``o`` output tokens are sent by ``llmserve bench``'s client;
then the pool is scaled to two and bursts of ``2n`` measure two busy instances
side by side (the balancer gives each ``n``), which is what core sharing costs.
Each request becomes an :class:`~llmserve.sim.http_calibration.Observation`;
:mod:`llmserve.sim.http_calibration` fits the profile to them.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import astuple, fields
from pathlib import Path
from typing import Any

import numpy as np

from llmserve.serve.serve_process import ServeProcess
from llmserve.bench.cli import Plan, execute
from llmserve.bench.client import EndpointConfig
from llmserve.bench.config import BenchConfig, LoadConfig
from llmserve.bench.tokenizer import Tokenizer
from llmserve.sim.http_calibration import Observation
from llmserve.fidelity.live_replay import trace_requests
from llmserve.sim.traces import Trace


def burst_trace(n: int, prompt: int, output: int) -> Trace:
    """``n`` requests arriving together."""
    return Trace(f"burst-{n}x{prompt}", np.zeros(n), np.full(n, prompt), np.full(n, output),
                 np.zeros(n, np.int8), 0.0)


def pinned_pool(serve_dict: dict[str, Any], instances: int) -> dict[str, Any]:
    """The serve config with its pool fixed at ``instances`` (static policy, scaling allowed by hand)."""
    auto = dict(serve_dict.get("autoscale", {}))
    bounds = {**auto.get("bounds", {}), "min_instances": 1}
    bounds["max_instances"] = max(bounds.get("max_instances", 1), 2)
    auto.update(policy="static", static={"instances": instances}, bounds=bounds)
    return {**serve_dict, "autoscale": auto}


def _burst(serve: ServeProcess, served_name: str, tok: Tokenizer, n: int, prompt: int, output: int,
           seed: int) -> list[tuple[float, float]]:
    """(TTFT, TPOT) of each request of one burst that completed with ``output`` tokens."""
    requests = trace_requests(burst_trace(n, prompt, output), tok, seed)
    bench = BenchConfig(endpoint=EndpointConfig(base_url=serve.url, model=served_name, ignore_eos=True,
                                                timeout_s=300.0),
                        load=LoadConfig(num_prompts=n), show_progress=False)
    result = execute(bench, Plan(tok, requests, [0.0] * n, []))
    out = []
    for r in result.records:
        if r.success and len(r.chunk_s) > 1 and r.output_tokens == output:
            out.append((r.chunk_s[0], (r.chunk_s[-1] - r.chunk_s[0]) / (output - 1)))
    return out


def measure_http(serve_dict: dict[str, Any], served_name: str, tok: Tokenizer, workdir: Path, *,
                 concurrencies: Sequence[int] = (1, 2, 4), prompts: Sequence[int] = (16, 96),
                 output: int = 16, repeats: int = 3, shared: bool = True, seed: int = 0,
                 log: Callable[[str], None] = print) -> list[Observation]:
    """Observations of one instance busy alone, then (``shared``) of two busy together."""
    obs: list[Observation] = []
    serve = ServeProcess(pinned_pool(serve_dict, 1), workdir)
    try:
        serve.wait_until(lambda p: p["counts"]["ready"] >= 1, 600.0, "one ready instance")
        _burst(serve, served_name, tok, 2, 16, 4, seed + 999)  # warm-up: first-request costs
        for busy in (1, 2) if shared else (1,):
            if busy == 2:
                serve.scale(2, "calibration: two busy instances")
                serve.wait_until(lambda p: p["counts"]["ready"] >= 2, 600.0, "two ready instances")
                _burst(serve, served_name, tok, 4, 16, 4, seed + 998)
            for rep in range(repeats):
                for n in concurrencies:
                    for p in prompts:
                        got = _burst(serve, served_name, tok, n * busy, p, output, seed + 100 * rep + n + p)
                        obs += [Observation(busy, n, p, output, ttft, tpot) for ttft, tpot in got]
                        if got:
                            log(f"http calibration: {busy} busy x {n} concurrent, prompt {p}: TTFT p50 "
                                f"{np.median([g[0] for g in got]):.3f}s, TPOT p50 "
                                f"{np.median([g[1] for g in got]):.4f}s ({len(got)} of {n * busy})")
    finally:
        serve.stop()
    return obs


def write_observations(path: Path, obs: Sequence[Observation]) -> None:
    """The calibration's raw requests, one CSV row each (to refit or to plot)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([fl.name for fl in fields(Observation)])
        w.writerows(astuple(o) for o in obs)
