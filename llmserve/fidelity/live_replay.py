"""Replay a simulator trace through a live ``llmserve serve``: the live half of the fidelity check.

The trace's requests are sent by ``llmserve bench``'s own client at the trace's
arrival times, with prompts of exactly the trace's token counts (filler text
built with the model's tokenizer) and ``ignore_eos`` so every answer is exactly
the trace's output length. ``llmserve serve`` runs as a child process with the
given config; once its minimum pool is ready the trace starts, and when every
request has ended the admin API's event log and scaling decisions are read and
serve is stopped (SIGTERM: it drains and stops its instances), but not before
the trace's duration is over, so the pool is observed over the whole window.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmserve.serve.serve_config import ServeConfig
from llmserve.serve.serve_process import ServeProcess
from llmserve.bench.cli import Plan, execute
from llmserve.bench.client import EndpointConfig
from llmserve.bench.config import BenchConfig, LoadConfig
from llmserve.bench.datasets import BATCH_PRIORITY, DEFAULT_PRIORITY, SampleRequest
from llmserve.bench.records import RequestRecord
from llmserve.bench.tokenizer import Tokenizer, count_tokens, exact_text
from llmserve.sim.traces import BATCH, Trace

TEXT_STREAM = 4  # sub-stream of the seed for prompt texts, apart from the trace's own draws


def trace_requests(trace: Trace, tok: Tokenizer, seed: int = 0) -> list[SampleRequest]:
    """One request per trace row: a prompt of exactly its token count, its output length, its class."""
    rng = np.random.default_rng((seed, TEXT_STREAM))
    out = []
    for p, o, cls in zip(trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), trace.priority.tolist()):
        text = exact_text(tok, p, rng)
        out.append(SampleRequest(text, count_tokens(tok, text), o,
                                 priority=BATCH_PRIORITY if cls == BATCH else DEFAULT_PRIORITY))
    return out


@dataclass(slots=True)
class LiveRun:
    """What the live replay saw; times in the event log are wall-clock, ``t0`` is the trace's zero."""

    records: list[RequestRecord]
    t0: float
    ready_at_start: int
    events: list[dict]
    decisions: list[dict]  # the ticks that changed the count
    exit_code: int | None
    serve_log: str
    prompt_chars: int  # characters of all prompts sent (what the live controller counts tokens from)


@dataclass(frozen=True, slots=True)
class Startup:
    """One instance's way up, from the event log."""

    instance_id: str
    created: float
    cold_start_s: float  # asked for -> ready (in the pool)
    warmup_s: float  # warming -> ready; 0 when both were seen at one probe


def startups(events: Sequence[Mapping[str, Any]]) -> list[Startup]:
    """Every instance that became ready, with its cold start and warm-up."""
    created: dict[str, float] = {}
    warming: dict[str, float] = {}
    out = []
    for e in sorted(events, key=lambda e: e["seq"]):
        if e["kind"] != "transition":
            continue
        iid = e["instance_id"]
        if e["old"] is None:
            created[iid] = e["time"]
        elif e["new"] == "warming":
            warming[iid] = e["time"]
        elif e["new"] == "ready" and e["old"] == "warming" and iid in created:
            start = created.pop(iid)
            out.append(Startup(iid, start, e["time"] - start, e["time"] - warming.get(iid, e["time"])))
    return out


def typical_startup(all_startups: Sequence[Startup], t0: float, t1: float) -> tuple[float, float]:
    """Median cold start and warm-up, of the instances started during ``[t0, t1]`` when there
    are any (they started on a loaded machine, as the simulator's scale-ups do), else of all."""
    during = [s for s in all_startups if t0 <= s.created <= t1] or list(all_startups)
    if not during:
        raise ValueError("no instance became ready: no cold start to measure")
    cold = statistics.median(s.cold_start_s for s in during)
    return cold, min(cold, statistics.median(s.warmup_s for s in during))


def replay_live(trace: Trace, serve_config: dict[str, Any], tok: Tokenizer, workdir: Path, *, seed: int = 0,
                request_timeout_s: float = 600.0, start_timeout_s: float = 600.0,
                log: Callable[[str], None] = print) -> LiveRun:
    """Start serve with ``serve_config``, send the trace, collect, stop serve."""
    cfg = ServeConfig.model_validate(serve_config)
    min_n = cfg.autoscale_config().bounds.min_instances
    requests = trace_requests(trace, tok, seed)
    keys = [k.get_secret_value() for k in cfg.gateway.auth.api_keys] or [None]
    serve = ServeProcess(serve_config, workdir)
    try:
        log(f"llmserve serve on {serve.url} (log {serve.log_path}); waiting for {min_n} ready instance(s)")
        pool = serve.wait_until(lambda p: p["counts"]["ready"] >= min_n and p["counts"]["starting"] == 0
                                and p["counts"]["warming"] == 0, start_timeout_s, "the minimum pool")
        ready = pool["counts"]["ready"]
        log(f"{ready} ready; sending {len(requests)} requests over {trace.duration_s:.0f}s")
        bench = BenchConfig(
            endpoint=EndpointConfig(base_url=serve.url, model=cfg.served_name, api_key=keys[0], ignore_eos=True,
                                    timeout_s=request_timeout_s),
            load=LoadConfig(num_prompts=max(1, len(requests))), show_progress=False)
        result = execute(bench, Plan(tok, requests, trace.arrival_s.tolist(), []))
        # Keep serving until the trace's window is over: the simulator bills its pool to the
        # window's end, and stopping serve earlier would cut the live bill short.
        left = result.meta["origin_wall"] + trace.duration_s - time.time()
        if left > 0:
            log(f"all requests ended; serving the last {left:.1f}s of the trace's window")
            time.sleep(left)
        events, decisions = serve.events(), serve.decisions(changes_only=True)
    finally:
        code = serve.stop()
    return LiveRun(result.records, result.meta["origin_wall"], ready, events, decisions, code, serve.log(),
                   sum(len(r.prompt) for r in requests))
