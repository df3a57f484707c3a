"""Spot reclaims under streaming load through ``llmserve serve``: the figures in README.md.

The scenario of ``tests/autoscale/test_live_spot_kill.py`` (which checks that every
stream completes as if undisturbed) with more load: a static pool of two tiny
engines, one on-demand and one spot, ``--clients`` closed-loop clients each sending
greedy 100-token streams (completions and chats, ``ignore_eos``, temperature 0,
``return_token_ids``) slowed by ``--fault-chunk-latency-ms``. Each prompt's
undisturbed token ids are taken first; then, under load, the spot instance is
reclaimed once per ``--notices`` entry (0: SIGKILL at once), waiting each time for
its replacement to be ready. Per reclaim:

- requests sent / ok (``[DONE]``, no error event) / failed, and how many differ
  from their prompt's undisturbed ids;
- streams cut (began on the reclaimed instance, still running at the kill) and the
  gateway's ``stream_resumes_total`` by outcome;
- seconds from the reclaim to the replacement joining the pool;
- the resume gap of cut streams (their longest wait between events) against the
  inter-event time of the other streams, and the TTFT of streams that began within
  2 s after the kill against the others'.

    python3 benchmarks/autoscale/spot_reclaim.py --out benchmarks/autoscale/spot_reclaim.json

Never part of the test suite: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.autoscale.serve_harness import ServeProcess, percentile, serve_config  # noqa: E402
from tests.autoscale.streams import Stream, greedy_requests, join, run_streams  # noqa: E402
from tests.autoscale.test_live_spot_kill import on, spot_row  # noqa: E402
from tests.helpers import make_tiny_llama  # noqa: E402

TOKENS = 100
KILL_WINDOW_S = 2.0  # streams begun this soon after a kill: their TTFT is reported apart


def config(model: Path, clients: int, chunk_latency_ms: float) -> dict:
    seqs = str(max(4, clients))  # one instance can hold every stream once the other is gone
    return serve_config(model, engine_args=["--max-num-seqs", seqs, "--fault-chunk-latency-ms", str(chunk_latency_ms)],
                        autoscale={"policy": "static", "tick_s": 60.0, "static": {"instances": 2},
                                   "bounds": {"min_instances": 1, "max_instances": 3},
                                   "capacity": {"spot": {"max_instances": 2, "price_per_hour": 0.35}}})


class Clients:
    """Closed-loop streaming clients; client ``c``'s ``k``-th request is prompt ``(c + k) % prompts``."""

    def __init__(self, url: str, requests: list[tuple[str, dict]], clients: int, stagger_s: float) -> None:
        self.url, self.requests, self.stagger_s = url, requests, stagger_s
        self.done: list[tuple[int, Stream]] = []
        self.active: dict[int, tuple[int, Stream]] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(clients)]

    def _run(self, c: int) -> None:
        self._stop.wait(c * self.stagger_s)  # else equal streams begin and end in step
        with httpx.Client(base_url=self.url, timeout=120, trust_env=False) as client:
            k = 0
            while not self._stop.is_set():
                p = (c + k) % len(self.requests)
                s = Stream(*self.requests[p])
                self.active[c] = (p, s)
                s.run(client)
                self.done.append((p, s))
                k += 1

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        join(self._threads, 130)


def resumes(serve: ServeProcess) -> dict[str, float]:
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(serve.metrics())
            for s in f.samples if s.name == "llmserve:gateway_stream_resumes_total"}


def reclaim(serve: ServeProcess, load: Clients, ref: list[list[int]], notice_s: float, warm_s: float) -> dict:
    """One reclaim of the spot instance under ``load``; its figures."""
    time.sleep(warm_s)
    spot = spot_row(serve)
    before, first = resumes(serve), len(load.done)
    at_notice = sum(on(s, spot) and not s.done for _, s in list(load.active.values()))
    wall, mono = time.time(), time.monotonic()
    r = serve.admin("POST", f"/autoscale/instances/{spot['instance_id']}/reclaim", params={"notice_s": notice_s})
    r.raise_for_status()
    kill = mono + (r.json()["reclaim_at"] - wall)  # monotonic time of the SIGKILL
    sid = spot["instance_id"]
    serve.wait_until(lambda p: p["counts"]["ready"] == 2 and p["counts"]["draining"] == 0 and any(
        i["replaces"] == sid and i["state"] == "ready" for i in serve.instances(finished=False)), 180,
        "the replacement ready")
    time.sleep(3.0)  # the replacement takes traffic
    rows = serve.instances()
    new = next(i for i in rows if i["replaces"] == sid)
    old = next(i for i in rows if i["instance_id"] == sid)
    joined = next(e["time"] for e in serve.events()
                  if e["kind"] == "pool_add" and e["instance_id"] == new["instance_id"])
    after = resumes(serve)
    streams = load.done[first:]  # finished since the reclaim (those then in flight included)
    cut = [s for _, s in streams if on(s, spot) and s.t0 < kill and s.times and s.times[-1] > kill]
    ok = [(p, s) for p, s in streams if not s.problems()]
    others = [s for _, s in ok if all(s is not c for c in cut)]
    gaps = [g for s in others for g in s.gaps()]
    ttft_after = [s.times[0] - s.t0 for s in others if kill <= s.t0 < kill + KILL_WINDOW_S and s.times]
    ttft_rest = [s.times[0] - s.t0 for s in others if not kill <= s.t0 < kill + KILL_WINDOW_S and s.times]
    resume_gaps = [max(s.gaps()) for s in cut if len(s.times) > 1]
    return {
        "notice_s": notice_s, "requests": len(streams), "ok": len(ok), "failed": len(streams) - len(ok),
        "differ_from_undisturbed": sum(s.token_ids() != ref[p] for p, s in ok),
        "failures": [s.problems()[:1] for _, s in streams if s.problems()][:5],
        "on_reclaimed_at_notice": at_notice, "streams_cut": len(cut),
        "reclaimed_end": {"state": old["state"], "exit_code": old["exit_code"]},
        "gateway_resumes": {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)},
        "reclaim_to_replacement_in_pool_s": round(joined - wall, 2),
        "resume_gap_s": {"p50": percentile(resume_gaps, 50), "max": max(resume_gaps, default=None)},
        "inter_event_s_others": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99)},
        "ttft_s_begun_within_2s_after_kill": {"n": len(ttft_after), "p50": percentile(ttft_after, 50),
                                              "max": max(ttft_after, default=None)},
        "ttft_s_others": {"p50": percentile(ttft_rest, 50), "p99": percentile(ttft_rest, 99)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--chunk-latency-ms", type=float, default=25.0)
    ap.add_argument("--notices", default="0,1,0,1", help="comma-separated reclaim notices in seconds (0: SIGKILL)")
    ap.add_argument("--warm-s", type=float, default=5.0, help="load before each reclaim")
    ap.add_argument("--stagger-s", type=float, default=0.25, help="between the clients' first requests")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    requests = greedy_requests(args.prompts, TOKENS)
    with tempfile.TemporaryDirectory(prefix="llmserve-spot-reclaim-") as tmp:
        model = make_tiny_llama(Path(tmp), seed=5, name="tiny-spot-bench")
        serve = ServeProcess(config(model, args.clients, args.chunk_latency_ms), Path(tmp))
        try:
            serve.wait_ready(2, timeout=240)
            streams, threads = run_streams(serve.url, requests)
            join(threads, 120)
            if any(s.problems() for s in streams):
                raise SystemExit(f"the undisturbed run failed: {[s.problems() for s in streams]}")
            ref = [s.token_ids() for s in streams]
            with Clients(serve.url, requests, args.clients, args.stagger_s) as load:
                results = [reclaim(serve, load, ref, float(n), args.warm_s) for n in args.notices.split(",")]
            done = list(load.done)  # the whole run's, in-flight ones finished at the clients' stop
        finally:
            serve.stop()
    bad = [s for _, s in done if s.problems()]
    total = {"requests": len(done), "ok": len(done) - len(bad), "failed": len(bad),
             "differ_from_undisturbed": sum(s.token_ids() != ref[p] for p, s in done if not s.problems())}
    for fig in results:
        print(json.dumps(fig), flush=True)
    print("whole run:", json.dumps(total))
    if args.out:
        Path(args.out).write_text(json.dumps({"clients": args.clients, "prompts": args.prompts, "tokens": TOKENS,
                                              "chunk_latency_ms": args.chunk_latency_ms, "whole_run": total,
                                              "reclaims": results}, indent=2) + "\n")
    return 0 if total["failed"] == total["differ_from_undisturbed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
