"""A burst, then silence, through ``llmserve serve`` with every policy at its defaults.

The scenario live runs showed policies failing: a tiny model, ``--max-num-seqs 2``
per instance, bounds 1-3, tick 1 s, scale-up cooldown 3 s, scale-down window 10 s,
a 3 s extra cold start; 15 s of one client, 45 s of 12 concurrent clients (96-token
answers), then 120 s of silence. Per policy: the most ready instances during the burst,
seconds from the silence until the pool is back at its minimum, and requests lost.

    python3 benchmarks/autoscale/burst_silence.py --policies predictive,kpa,threshold \
        --out benchmarks/autoscale/burst_silence.json

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

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmserve.serve.serve_process import ServeProcess  # noqa: E402
from tests.helpers import make_tiny_llama  # noqa: E402

QUIET_S, BURST_S, SILENCE_S, CLIENTS = 15.0, 45.0, 120.0, 12


def config(model: Path, policy: str) -> dict:
    return {"model": str(model), "served_model_name": "tiny", "threads_per_instance": 1,
            "engine_args": ["--max-num-seqs", "2"], "cold_start_delay_s": 3.0, "log_level": "info",
            "gateway": {"polling": {"load_interval_s": 0.2, "ready_interval_s": 0.5, "timeout_s": 2.0}},
            "autoscale": {"policy": policy, "tick_s": 1.0,
                          "bounds": {"min_instances": 1, "max_instances": 3, "scale_up_cooldown_s": 3.0,
                                     "scale_down_window_s": 10.0}}}


def client(url: str, until: float, results: list[bool]) -> None:
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 96, "ignore_eos": True}
    with httpx.Client(timeout=120, trust_env=False) as c:
        while time.monotonic() < until:
            try:
                results.append(c.post(url + "/v1/completions", json=body).status_code == 200)
            except httpx.HTTPError:
                results.append(False)


def ready_count(serve: ServeProcess) -> int:
    return serve.pool()["counts"]["ready"]


def one(policy: str, workdir: Path, model: Path) -> dict:
    serve = ServeProcess(config(model, policy), workdir)
    results: list[bool] = []
    samples: list[tuple[float, int]] = []
    try:
        serve.wait_ready(1, timeout=120)
        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(serve.url, t0 + QUIET_S + BURST_S, results))]
        threads[0].start()
        time.sleep(QUIET_S)
        threads += [threading.Thread(target=client, args=(serve.url, t0 + QUIET_S + BURST_S, results))
                    for _ in range(CLIENTS - 1)]
        for t in threads[1:]:
            t.start()
        silence_at = None
        while time.monotonic() < t0 + QUIET_S + BURST_S + SILENCE_S:
            samples.append((time.monotonic() - t0, ready_count(serve)))
            if silence_at is None and not any(t.is_alive() for t in threads):
                silence_at = time.monotonic() - t0
            time.sleep(0.5)
        for t in threads:
            t.join()
        silence_at = silence_at or QUIET_S + BURST_S
        back = next((t for t, n in samples if t > silence_at and n <= 1
                     and all(m <= 1 for u, m in samples if u >= t)), None)
        return {"policy": policy, "requests": len(results), "failed": results.count(False),
                "peak_ready_in_burst": max(n for t, n in samples if QUIET_S <= t <= silence_at),
                "back_to_min_after_silence_s": None if back is None else round(back - silence_at, 1),
                "decisions": [(d["provisioned"], d["desired"], d["reason"]) for d in serve.decisions()][-8:]}
    finally:
        serve.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="predictive,kpa,threshold")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_llama(Path(tmp))
        for policy in args.policies.split(","):
            work = Path(tmp) / policy
            work.mkdir()
            row = one(policy, work, model)
            print(json.dumps({k: v for k, v in row.items() if k != "decisions"}), flush=True)
            rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
