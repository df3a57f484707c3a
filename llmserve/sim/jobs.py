"""Several simulated runs at once (``--jobs N``): one process per run, plain data back.

Each run is independent (its own trace copy, pool, gateway and policy), so the
policies of a comparison spread over processes with no shared state. What goes
to a child is a plain dict (the trace's columns as raw bytes, the profile's
JSON, the autoscale and simulator settings as JSON-shaped dicts, the policy and
pool sizes), and what comes back is a plain dict
(the summary, the timeline as lists, per-request arrays as raw bytes with their
dtype). Children send progress as ``(label, simulated s, arrivals)`` tuples.
Children are spawned, not forked: nothing of the parent's threads or state comes along.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue as queue_mod
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from llmserve.autoscale import AutoscaleConfig, StaticConfig
from llmserve.sim.oracle import oracle
from llmserve.sim.profile import InstanceProfile
from llmserve.sim.results import SimResult, Summary
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace

_ARRAYS = ("status", "ttft", "e2e")
ORACLE = "oracle"  # beside the policies: the cheapest schedule that meets the SLO knowing the trace
_progress: Any = None  # the child's end of the progress queue (set by its initializer)


def job(policy: str, static_n: int, start: int) -> tuple[str, int]:
    """The label and starting size of one policy's run (static runs at its own size)."""
    return (f"static-{static_n}", static_n) if policy == "static" else (policy, start)


def simulate_one(trace: Trace, profile, base: AutoscaleConfig, sim: SimConfig, policy: str, static_n: int,
                 start: int, progress=None, oracle_target: float = 0.999, log=None) -> SimResult:
    if policy == ORACLE:  # a schedule searched offline (several runs in turn), not a policy's config
        return oracle(trace, profile, base, sim, target=oracle_target, log=log)
    label, n0 = job(policy, static_n, start)
    cfg = base.model_copy(update={"policy": policy, "static": StaticConfig(instances=static_n)})
    s = Simulator(trace, profile, cfg, sim.model_copy(update={"initial_instances": n0}), label=label)
    s.progress = progress
    return s.run()


def to_plain(res: SimResult) -> dict:
    return {"summary": res.summary.as_dict(), "timeline": res.timeline.tolist(),
            "events": [list(e) for e in res.events], "lifetimes": [list(x) for x in res.lifetimes],
            **_arrays(res, _ARRAYS)}


def from_plain(d: dict, trace: Trace) -> SimResult:
    arrays = _unpack(d, _ARRAYS)
    timeline = np.array(d["timeline"], dtype=float).reshape(len(d["timeline"]), -1)
    return SimResult(Summary(**d["summary"]), trace.arrival_s, arrays["status"], arrays["ttft"], arrays["e2e"],
                     timeline, [tuple(e) for e in d["events"]], [tuple(x) for x in d["lifetimes"]])


def _arrays(obj, names) -> dict:
    return {k: (getattr(obj, k).dtype.str, getattr(obj, k).tobytes()) for k in names}


def _unpack(d: dict, names) -> dict:
    return {k: np.frombuffer(d[k][1], dtype=np.dtype(d[k][0])).copy() for k in names}


_TRACE = ("arrival_s", "prompt_tokens", "output_tokens", "priority", "rate_t", "rate_rps")


def _init(q) -> None:
    global _progress
    _progress = q


def _child(spec: dict) -> dict:
    t = spec["trace"]
    trace = Trace(t["name"], duration_s=t["duration_s"], **_unpack(t, _TRACE))
    profile = InstanceProfile.from_dict(json.loads(spec["profile"]))
    label, _ = job(spec["policy"], spec["static_n"], spec["start"])
    q = _progress
    report = (lambda t, k: q.put((label, t, k))) if q is not None else None
    said: list[str] = []  # the oracle's rounds, said by the parent once the run is back
    res = simulate_one(trace, profile, AutoscaleConfig.model_validate(spec["autoscale"]),
                       SimConfig.model_validate(spec["sim"]), spec["policy"], spec["static_n"], spec["start"], report,
                       spec["oracle_target"], said.append)
    return {**to_plain(res), "said": said}


class RunProgress:
    """One bar per run: simulated time of the trace's duration, and simulated requests per second."""

    def __init__(self, duration_s: float, console: Console, enabled: bool = True) -> None:
        self.duration_s = max(duration_s, 1e-9)
        self.bars = Progress(TextColumn("{task.description:<14}"), BarColumn(),
                             TextColumn("{task.fields[sim]} of {task.fields[day]}"),
                             TextColumn("{task.fields[rate]:>9,.0f} req/s"), TimeElapsedColumn(),
                             console=console, disable=not enabled, transient=False)
        self._tasks: dict[str, tuple[int, float, float]] = {}  # label: (task, wall start, last wall)

    def __enter__(self) -> "RunProgress":
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

    def update(self, label: str, t: float, arrived: int) -> None:
        now = time.perf_counter()
        if label not in self._tasks:
            task = self.bars.add_task(label, total=self.duration_s, sim=_hms(0), day=_hms(self.duration_s), rate=0.0)
            self._tasks[label] = (task, now, 0.0)
        task, began, last = self._tasks[label]
        if now - last < 0.2 and t < self.duration_s:
            return  # a redraw at most five times a second
        self._tasks[label] = (task, began, now)
        self.bars.update(task, completed=min(t, self.duration_s), sim=_hms(t),
                         rate=arrived / max(now - began, 1e-9))


def _hms(t: float) -> str:
    t = int(t)
    return f"{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}"


def run_jobs(trace: Trace, profile, base: AutoscaleConfig, sim: SimConfig,
             policies: list[str], static_n: int, start: int, jobs: int, progress: RunProgress | None = None,
             log=None, oracle_target: float = 0.999) -> list[SimResult]:
    """Every policy's run (``oracle`` too), ``jobs`` at a time; results in the order of ``policies``."""
    return run_many(trace, profile, base, sim, [(p, static_n, start) for p in policies], jobs, progress, log=log,
                    oracle_target=oracle_target)


def run_many(trace: Trace, profile, base: AutoscaleConfig, sim: SimConfig, runs: list[tuple[str, int, int]],
             jobs: int, progress: RunProgress | None = None, log=None, oracle_target: float = 0.999
             ) -> list[SimResult]:
    """``(policy, static size, starting size)`` runs, ``jobs`` at a time, results in order."""
    if jobs <= 1 or len(runs) <= 1:
        out = []
        for p, static_n, start in runs:
            cb = (lambda t, k, lb=job(p, static_n, start)[0]: progress.update(lb, t, k)) if progress else None
            out.append(simulate_one(trace, profile, base, sim, p, static_n, start, cb, oracle_target, log))
            _logged(out[-1], log)
        return out
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    plain_trace = {"name": trace.name, "duration_s": trace.duration_s, **_arrays(trace, _TRACE)}
    specs = [{"trace": plain_trace, "profile": profile.to_json(), "autoscale": base.model_dump(mode="json"),
              "sim": sim.model_dump(mode="json"), "policy": p, "static_n": static_n, "start": start,
              "oracle_target": oracle_target}
             for p, static_n, start in runs]
    # the oracle's rounds run one after another: it goes first, the policies' runs fill the other seats
    order = sorted(range(len(specs)), key=lambda i: specs[i]["policy"] != ORACLE)
    done = threading.Event()

    def drain() -> None:  # progress from the children, shown here
        while not done.is_set():
            try:
                label, t, k = q.get(timeout=0.2)
            except queue_mod.Empty:
                continue
            if progress is not None:
                progress.update(label, t, k)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        with ProcessPoolExecutor(min(jobs, len(specs)), mp_context=ctx, initializer=_init, initargs=(q,)) as pool:
            back = list(pool.map(_child, [specs[i] for i in order]))
    finally:
        done.set()
        reader.join()
    plain = [d for _, d in sorted(zip(order, back), key=lambda x: x[0])]
    del back
    results = []
    while plain:  # each child's raw bytes let go once converted: a 10 M day's are ~160 MB a run
        d = plain.pop(0)
        for line in d.pop("said"):
            if log:
                log(line)
        results.append(from_plain(d, trace))
        _logged(results[-1], log)
    return results


def _logged(res: SimResult, log) -> None:
    if log:
        s = res.summary
        log(f"{s.policy}: {s.ttft_attainment:.2%} within TTFT SLO, {s.instance_hours:.1f} instance-hours "
            f"({s.wall_s:.1f}s, {s.requests / max(s.wall_s, 1e-9):,.0f} req/s)")
