"""A live soak: a compressed diurnal day with a burst through ``llmserve serve``, every policy in turn.

Each policy gets the same trace (trough at the start and end, the day's peak in
the middle, a burst of ``--burst-factor`` times the rate at 70 % of the day),
replayed live by the fidelity check's own replay (:mod:`llmserve.fidelity.live_replay`:
serve as a child process, the bench client at the trace's arrival times, exact
prompt and output lengths) and simulated the way the fidelity check simulates
(:func:`llmserve.fidelity.fidelity_check.simulate_like`: serve's own autoscale,
gateway and controller settings, the HTTP-calibrated ``--profile`` with the cold
start measured live). Per policy: requests sent / ok / failed (lost must be 0),
TTFT SLO attainment, instance-seconds, live against simulated, and a plot of
load and instances over time (``<out>/<policy>.png``).

    python3 benchmarks/autoscale/soak.py --minutes 20 --out benchmarks/autoscale/soak

Never part of the test suite: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmserve.autoscale.config import POLICY_NAMES  # noqa: E402
from llmserve.serve.serve_config import ServeConfig  # noqa: E402
from llmserve.autoscale.usage import Span, spans_from_events  # noqa: E402
from llmserve.sim.fidelity import compare, markdown  # noqa: E402
from llmserve.sim.traces import LengthDist, Trace, from_rate_curve  # noqa: E402

STEP_S = 5.0  # the rate curve's resolution
BURST_AT, BURST_LEN = 0.7, 0.04  # the burst's start and length, as shares of the day


def soak_rate(t: np.ndarray, duration_s: float, trough_rps: float, peak_rps: float,
              burst_factor: float) -> np.ndarray:
    """A day squeezed into ``duration_s``: a cosine from trough to peak (mid-day) and back, times a
    ``burst_factor`` flash crowd over ``[BURST_AT, BURST_AT + BURST_LEN]`` of the day."""
    if not (0 < trough_rps <= peak_rps and burst_factor >= 1 and duration_s > 0):
        raise ValueError("soak: need 0 < trough <= peak, burst_factor >= 1, a positive duration")
    phase = 2 * np.pi * np.asarray(t, float) / duration_s
    base = trough_rps + (peak_rps - trough_rps) * (1 - np.cos(phase)) / 2
    share = np.asarray(t, float) / duration_s
    burst = (share >= BURST_AT) & (share < BURST_AT + BURST_LEN)
    return base * np.where(burst, burst_factor, 1.0)


def soak_trace(minutes: float, trough_rps: float, peak_rps: float, burst_factor: float,
               prompt: LengthDist, output: LengthDist, seed: int = 0) -> Trace:
    duration = minutes * 60.0
    t = np.arange(0.0, duration, STEP_S)
    rate = soak_rate(t + STEP_S / 2, duration, trough_rps, peak_rps, burst_factor)
    return from_rate_curve(f"soak-{minutes:g}min", t, rate, duration, np.random.default_rng(seed), prompt, output)


def policy_config(base: dict[str, Any], policy: str) -> dict[str, Any]:
    """``base`` (serve's YAML) with ``policy`` in charge; every policy's own section is kept."""
    if policy not in POLICY_NAMES:
        raise ValueError(f"soak: unknown policy {policy!r}: use {POLICY_NAMES}")
    cfg = copy.deepcopy(base)
    cfg.setdefault("autoscale", {})["policy"] = policy
    return cfg


def attainment(ttft_s: np.ndarray, slo_s: float) -> float:
    """Share of all requests whose first token came within the SLO (a failed one misses it)."""
    ttft = np.asarray(ttft_s, float)
    return float(np.mean(np.nan_to_num(ttft, nan=np.inf) <= slo_s)) if len(ttft) else float("nan")


def held_curve(spans: list[Span], t: np.ndarray, t_end: float) -> np.ndarray:
    """Instances held at each time of ``t`` (an open span runs to ``t_end``)."""
    t = np.asarray(t, float)
    out = np.zeros(len(t), int)
    for start, end in spans:
        out += (t >= start) & (t < (t_end if end is None else end))
    return out


def policy_summary(policy: str, sent: int, ok: int, live_ttft: np.ndarray, sim_ttft: np.ndarray,
                   rows: list, slo_s: float) -> dict[str, Any]:
    """One policy's figures: lost requests, SLO attainment and instance-seconds, live and simulated."""
    by_key = {r.key: r for r in rows}
    inst = by_key["instance_seconds"]
    return {"policy": policy, "sent": sent, "ok": ok, "failed": sent - ok,
            "ttft_slo_s": slo_s, "live_ttft_attainment": attainment(live_ttft, slo_s),
            "sim_ttft_attainment": attainment(sim_ttft, slo_s),
            "live_instance_seconds": inst.live, "sim_instance_seconds": inst.sim,
            "instance_seconds_relative": inst.relative,
            "rows": [r.as_dict() for r in rows]}


def plot(path: Path, trace: Trace, policy: str, live_spans: list[Span], sim_spans: list[Span]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.linspace(0.0, trace.duration_s, 600)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.step(t / 60, held_curve(live_spans, t, trace.duration_s), where="post", label="instances live")
    ax.step(t / 60, held_curve(sim_spans, t, trace.duration_s), where="post", ls="--", label="instances sim")
    ax.set_xlabel("minutes")
    ax.set_ylabel("instances held")
    load = ax.twinx()
    load.plot(trace.rate_t / 60, trace.rate_rps, color="grey", alpha=0.5, label="load (req/s)")
    load.set_ylabel("req/s")
    ax.set_title(f"soak, {policy}: {len(trace)} requests over {trace.duration_s / 60:.0f} min")
    fig.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_policy(policy: str, base: dict, trace: Trace, profile, tok, seed: int, out: Path) -> dict[str, Any]:
    from dataclasses import replace

    from llmserve.fidelity.fidelity_check import live_figures, sim_figures, simulate_like
    from llmserve.fidelity.live_replay import replay_live, startups, typical_startup

    cfg = policy_config(base, policy)
    serve = ServeConfig.model_validate(cfg)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"llmserve-soak-{policy}-") as tmp:
        live = replay_live(trace, cfg, tok, Path(tmp), seed=seed)
    cold, warm = typical_startup(startups(live.events), live.t0, live.t0 + trace.duration_s)
    res = simulate_like(serve, trace, replace(profile, cold_start_s=cold, warmup_s=warm), live.ready_at_start, seed)
    live_fig, live_ttft, _ = live_figures(live, trace)
    rows = compare(live_fig, sim_figures(res, trace))
    ok = sum(r.success for r in live.records)
    summary = policy_summary(policy, len(live.records), ok, live_ttft, res.ttft, rows,
                             serve.autoscale_config().slo.ttft_s)
    summary.update(cold_start_s=cold, load_1m_before=load_before, load_1m_after=os.getloadavg()[0],
                   serve_exit_code=live.exit_code,
                   failures=sorted({r.failure_label for r in live.records if not r.success} - {None}))
    spans = [(s - live.t0, None if e is None else e - live.t0) for s, e in spans_from_events(live.events).values()]
    plot(out / f"{policy}.png", trace, policy, spans, res.lifetimes)
    (out / f"{policy}.md").write_text(markdown(rows))
    return summary


def calibrated_profile(base: dict, serve: ServeConfig, tok, out: Path, seed: int):
    """The fidelity check's HTTP calibration of ``base``'s instances; writes profile.json and calibration.csv."""
    from llmserve.fidelity.fidelity_check import measure_profile_http
    from llmserve.fidelity.http_measure import write_observations
    from llmserve.sim.profile import save_profile

    with tempfile.TemporaryDirectory(prefix="llmserve-soak-calibration-") as tmp:
        profile, _, obs = measure_profile_http(base, serve, tok, Path(tmp), seed=seed)
    write_observations(out / "calibration.csv", obs)
    save_profile(profile, out / "profile.json")
    return profile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0, help="length of the compressed day, per policy")
    ap.add_argument("--policies", default="static,threshold,kpa,predictive")
    ap.add_argument("--config", default=str(ROOT / "benchmarks/autoscale/soak-smollm2.yaml"))
    ap.add_argument("--profile", default=None,
                    help="the profile the simulator runs (default: calibrated through HTTP first, about 4 "
                    "minutes, as llmserve simulate --fidelity does)")
    ap.add_argument("--trough-rps", type=float, default=0.15)
    ap.add_argument("--peak-rps", type=float, default=0.9)
    ap.add_argument("--burst-factor", type=float, default=2.0)
    ap.add_argument("--prompt-len", type=float, default=32.0)
    ap.add_argument("--output-len", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/autoscale/soak"))
    args = ap.parse_args()

    from llmserve.bench.tokenizer import load_tokenizer
    from llmserve.fidelity.fidelity_check import model_source
    from llmserve.sim.profile import load_profile

    base = yaml.safe_load(Path(args.config).read_text())
    serve = ServeConfig.model_validate(base)
    tok = load_tokenizer(model_source(serve))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = load_profile(args.profile) if args.profile else calibrated_profile(base, serve, tok, out, args.seed)
    trace = soak_trace(args.minutes, args.trough_rps, args.peak_rps, args.burst_factor,
                       LengthDist(args.prompt_len, 0.5, 4, 256), LengthDist(args.output_len, 0.5, 2, 128), args.seed)
    results = []
    for policy in args.policies.split(","):
        print(f"soak: {policy}, {len(trace)} requests over {trace.duration_s:.0f}s", flush=True)
        s = run_policy(policy, base, trace, profile, tok, args.seed, out)
        results.append(s)
        print(json.dumps({k: v for k, v in s.items() if k != "rows"}), flush=True)
        doc = {"argv": sys.argv[1:], "trace": {"name": trace.name, "requests": len(trace),
                                               "duration_s": trace.duration_s},
               "profile": json.loads(profile.to_json()), "cpus": os.cpu_count(), "policies": results}
        (out / "soak.json").write_text(json.dumps(doc, indent=2, default=float) + "\n")
    print("\n| policy | sent | ok | failed | TTFT SLO attained live / sim | instance-s live / sim | relative |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in results:
        print(f"| {s['policy']} | {s['sent']} | {s['ok']} | {s['failed']} | {s['live_ttft_attainment']:.1%} / "
              f"{s['sim_ttft_attainment']:.1%} | {s['live_instance_seconds']:.0f} / {s['sim_instance_seconds']:.0f} "
              f"| {s['instance_seconds_relative']:+.0%} |")
    return 0 if all(s["failed"] == 0 for s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
