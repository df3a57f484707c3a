"""Live and compressed: ``llmserve bench`` drives a ramp up and down through ``llmserve serve``.

Real engine processes (a tiny random model, one CPU thread each, a 2 s extra cold
start), the real gateway and the default (predictive) policy with its time
constants shrunk from minutes to seconds. The checks are the ones that protect
users, not timings: instances go up and come back down to the minimum, no request
fails, no instance is stopped with a request in flight (each drained one exits 0
after the gateway and the engine both had nothing in flight), and a starting or
warming instance never receives traffic (it is never in the pool, and the gateway
never had to retry: an engine that is not ready would have answered 503).
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from llmserve.autoscale.usage import instance_seconds
from llmserve.bench.cli import execute
from llmserve.bench.client import EndpointConfig
from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig
from tests.helpers import make_tiny_llama

from .serve_harness import Sampler, ServeProcess, peak_ready, percentile, serve_config, settled_at

pytestmark = pytest.mark.slow

# (time_s, requests/s), linear in between: quiet, ramp up, hold, drop, quiet.
RAMP = [(0, 0.4), (15, 0.4), (35, 4.0), (55, 4.0), (60, 0.4), (85, 0.4), (85, 0.0)]
RAMP_START, RAMP_END = 15.0, 55.0


def live_config(model) -> dict:
    # About 26 tokens per request (10 prompt + 16 output) against a capacity prior of
    # 50 tokens/s planned at 80%: 0.4 req/s needs 1 instance, 4 req/s needs 3.
    return serve_config(
        model, cold_start_delay_s=2.0,
        autoscale={"policy": "predictive", "tick_s": 0.5,
                   "bounds": {"min_instances": 1, "max_instances": 3, "scale_up_cooldown_s": 2.0,
                              "scale_down_window_s": 10.0, "max_step_down": 1},
                   "predictive": {"lead_time_s": 10.0, "level_tau_s": 4.0, "trend_tau_s": 20.0,
                                  "capacity_tokens_per_s": 50.0, "capacity_tau_s": 3600.0,
                                  "capacity_from_model": False,  # the fixed prior stands in for a slow model
                                  "target_utilisation": 0.8, "margin_z": 0.0}},
        lifecycle={"probe_interval_s": 0.2, "signal_window_s": 8.0, "latency_window_s": 10.0,
                   "output_tokens_prior": 16.0, "stop_grace_s": 20.0, "drain_timeout_s": 30.0})


def bench_config(url: str, model_dir, trace_csv) -> BenchConfig:
    return BenchConfig(
        endpoint=EndpointConfig(base_url=url, model="tiny", ignore_eos=True, timeout_s=120),
        dataset=DatasetConfig(name="random", tokenizer=str(model_dir), random_input_len=16, random_output_len=16),
        load=LoadConfig(num_prompts=1000, rate_trace=str(trace_csv), seed=7), show_progress=False)


def run_ramp(tmp_path, model, config: dict) -> dict:
    """Serve, ramp, wait for the pool to come back to its minimum; return what was seen."""
    trace = tmp_path / "ramp.csv"
    trace.write_text("time_s,rate\n" + "".join(f"{t},{r}\n" for t, r in RAMP))
    serve = ServeProcess(config, tmp_path)
    try:
        serve.wait_ready(1, timeout=120)
        with Sampler(serve) as sampler:
            t0 = time.time()
            result = execute(bench_config(serve.url, model, trace))
            t_end = time.time()
            serve.wait_until(lambda p: settled_at(1)(p) and p["counts"]["ready"] == 1, 90,
                             "the pool back at its minimum")
        return {"serve": serve, "result": result, "t0": t0, "t_end": t_end, "sampler": sampler,
                "events": serve.events(), "instances": serve.instances(), "metrics": serve.metrics(),
                "decisions": serve.decisions()}
    except BaseException:
        serve.stop()
        raise


def figures(run: dict) -> dict:
    t0, t_end, events = run["t0"], run["t_end"], run["events"]
    ramp_at = t0 + RAMP_START
    traffic = run["sampler"].first_traffic()
    started_after = {e["instance_id"]: e["time"] for e in events
                     if e["kind"] == "transition" and e["old"] is None and e["time"] >= ramp_at}
    joined_after = sorted(traffic[i] for i in started_after if i in traffic)
    ups = [d for d in run["decisions"] if d["desired"] > d["provisioned"] and d["time"] >= ramp_at]
    ttft_ramp = [r.chunk_s[0] for r in run["result"].records
                 if r.success and r.chunk_s and RAMP_START <= r.scheduled_s <= RAMP_END]
    peak = peak_ready(run["sampler"].samples)
    used = instance_seconds(events, t0, t_end)
    cold = [e["details"]["cold_start_s"] for e in events if e["kind"] == "pool_add"]
    return {"time_to_new_instance_traffic_s": (joined_after[0] - ramp_at) if joined_after else None,
            "first_scale_up_decision_after_ramp_s": (ups[0]["time"] - ramp_at) if ups else None,
            "scale_ups_before_ramp": sum(1 for d in run["decisions"] if d["desired"] > d["provisioned"]
                                         and t0 <= d["time"] < ramp_at),
            "cold_start_s": cold,
            "ttft_p99_ramp_s": percentile(ttft_ramp, 99), "ttft_p50_ramp_s": percentile(ttft_ramp, 50),
            "peak_ready": peak, "instance_seconds": used, "fixed_peak_pool_instance_seconds": peak * (t_end - t0),
            "duration_s": t_end - t0, "requests": len(run["result"].records)}


def test_ramp_up_and_down_through_llmserve_serve(tmp_path):
    model = make_tiny_llama(tmp_path)
    run = run_ramp(tmp_path, model, live_config(model))
    serve = run["serve"]
    try:
        records = run["result"].records
        failed = [(r.index, r.failure_label, r.error[:200]) for r in records if not r.success]
        assert len(records) > 100 and failed == [], failed

        events, sampler = run["events"], run["sampler"]
        started = [e["instance_id"] for e in events if e["kind"] == "transition" and e["old"] is None]
        peak = peak_ready(sampler.samples)
        assert peak >= 2, f"never scaled up: {run['decisions']}"
        final = serve.pool()
        assert final["counts"] == {"starting": 0, "warming": 0, "ready": 1, "draining": 0, "stopping": 0}

        # No traffic to a starting or warming instance.
        assert sampler.samples and sampler.violations() == []
        for iid in started:
            kinds = [(e["kind"], e["new"]) for e in events if e["instance_id"] == iid]
            if ("pool_add", "ready") in kinds:
                assert kinds.index(("pool_add", "ready")) > kinds.index(("transition", "ready"))
        metrics = run["metrics"]
        assert not re.search(r"^llmserve:gateway_retries_total\{.*\} [1-9]", metrics, re.MULTILINE), metrics
        # (A client that closes right after the last event can be counted as disconnected;
        # that says nothing about instances, so only upstream-side errors count here.)
        errors = re.findall(r'^llmserve:gateway_errors_total\{.*kind="([^"]+)".*\} ([0-9.]+)$', metrics, re.MULTILINE)
        assert [(k, v) for k, v in errors if k != "client_disconnected" and float(v) > 0] == [], metrics
        assert not re.search(r'^llmserve:gateway_requests_total\{.*status="5\d\d".*\} [1-9]', metrics, re.MULTILINE)

        # Every instance that served traffic and was stopped was drained first: nothing in
        # flight at the stop, and the engine exited 0 on SIGTERM.
        drained = [e for e in events if e["new"] == "stopping" and e["old"] == "draining"]
        assert drained, "no instance was drained"
        for stop in drained:
            iid = stop["instance_id"]
            assert stop["details"]["in_flight"] == 0, stop
            assert "drained" in stop["reason"], stop
            end = next(e for e in events if e["instance_id"] == iid and e["new"] == "stopped")
            assert end["details"]["exit_code"] == 0, end
            removed = next(e for e in events if e["instance_id"] == iid and e["kind"] == "pool_remove")
            assert removed["seq"] < stop["seq"]
        assert not [e for e in events if e["new"] == "failed"], events

        print("live ramp figures:", figures(run))
    finally:
        code = serve.stop()
    # uvicorn re-raises the SIGTERM it handled once shutdown is done, hence -15 as well as 0.
    assert code in (0, -signal.SIGTERM), serve.log()[-3000:]
    assert re.search(r"stopping 1 instance\(s\)[\s\S]*draining -> stopping \(controller shutting down\)"
                     r"[\s\S]*stopping -> stopped \(controller shutting down\)", serve.log())
    pids = [e["details"]["pid"] for e in run["events"] if e["kind"] == "started"]
    assert pids and not [pid for pid in pids if _alive(pid)], "engine processes outlived llmserve serve"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
