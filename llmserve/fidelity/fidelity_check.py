"""``llmserve simulate --fidelity``: the same trace through the live ``llmserve serve`` and the simulator.

The steps, each reusing the code that does it elsewhere:

1. the instance profile: by default measured through serve's HTTP path, as a
   client sees it (:mod:`llmserve.fidelity.http_measure`: the serve config's pool,
   fixed at one and then two busy instances, bursts of streaming requests) and
   fitted with a request overhead and core sharing
   (:mod:`llmserve.sim.http_calibration`), measured before and again after the
   live run and fitted to both (``http-before``: before only); ``engine``
   measures the engine alone in this process instead
   (:func:`llmserve.engine.calibration.measure_steps`,
   :func:`llmserve.sim.calibrate.calibrate`); batch and KV limits are the
   engine's own either way; or ``--fidelity-profile`` gives a profile JSON;
2. the live replay (:mod:`llmserve.fidelity.live_replay`): serve as a child process,
   the trace sent by the bench client, the event log read back;
3. the simulation: the serve config's very ``AutoscaleConfig``, gateway settings
   (admission, concurrency, balancer, load polling) and controller windows, the
   profile with the cold start and warm-up measured live, the same initial pool;
4. :mod:`llmserve.sim.fidelity` turns both into the same figures and the table.

This module only orchestrates; nothing here decides anything the policies,
gateway or simulator decide.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from llmserve.serve.serve_config import ServeConfig, serve_file
from llmserve.autoscale.usage import spans_from_events
from llmserve.bench.tokenizer import load_tokenizer
from llmserve.sim.fidelity import Row, SideFigures, compare, markdown, side_figures, table
from llmserve.fidelity.live_replay import LiveRun, replay_live, startups, typical_startup
from llmserve.sim.profile import InstanceProfile, StepModel, load_profile, save_profile
from llmserve.sim.results import SimResult, percentile
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace

ADMIN_KEY_PLACEHOLDER = "x" * 16  # gateway settings are read, not served: any valid key


@dataclass(frozen=True, slots=True)
class FidelitySettings:
    """Everything the check needs, validated once before anything starts."""

    serve_dict: dict[str, Any]  # what serve's YAML holds (the child gets exactly this, plus port and key)
    serve: ServeConfig
    trace: Trace
    seed: int
    profile_path: str | None
    out: Path | None
    # "http": through serve's HTTP path before and after the live run (default); "http-before": before
    # only (half the time); "engine": the engine alone in this process
    calibration: str = "http"
    request_timeout_s: float = 600.0


def settings_from_args(args: argparse.Namespace, trace: Trace) -> FidelitySettings:
    data = serve_file(args.serve_config, {"model": args.model} if args.model else None)
    serve = ServeConfig.model_validate(data)
    if serve.models is not None:
        raise ValueError("fidelity: the check replays one pool; give a single-model serve config, not models:")
    if not len(trace):
        raise ValueError("fidelity: the trace has no requests")
    return FidelitySettings(data, serve, trace, args.seed, args.fidelity_profile,
                            Path(args.out) if args.out else None, args.fidelity_calibration)


# ---- 1. the instance profile ---------------------------------------------------------------------
def engine_config_for(serve: ServeConfig):
    """The EngineConfig each serve instance builds: its flags parsed by the engine's own parser."""
    from llmserve.engine.argv import add_engine_args, engine_config_from

    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    argv = ["--model", serve.model, "--threads", str(serve.threads())]
    if serve.model_store:
        argv += ["--model-store", serve.model_store]
    args, _ = parser.parse_known_args(argv + list(serve.engine_args))  # server-only flags are not the engine's
    return engine_config_from(args)


def model_source(serve: ServeConfig) -> Path:
    """The model file or folder the instances load (for the bench's exact token counts)."""
    from llmserve.models.store import default_store_dir, resolve

    engine_cfg = engine_config_for(serve)
    return resolve(engine_cfg.model, engine_cfg.model_store or default_store_dir())


def engine_template(serve: ServeConfig) -> tuple[InstanceProfile, int, object]:
    """A profile with the serve engine's own batch and KV limits (step model to be fitted), its max
    model length, and the engine (built here, as each instance builds it)."""
    from llmserve.engine.llm import build_engine

    engine = build_engine(engine_config_for(serve))
    ec = engine.config
    template = InstanceProfile(f"measured-{serve.served_name}", StepModel(1.0, 0.0, 0.0, 0.0),
                               max_num_seqs=ec.max_num_seqs, max_num_batched_tokens=ec.max_num_batched_tokens,
                               kv_capacity_tokens=engine.kv.num_blocks * ec.block_size, cold_start_s=0.0,
                               warmup_s=0.0)
    return template, engine.max_model_len, engine


def measure_profile(serve: ServeConfig, log: Callable[[str], None]) -> tuple[InstanceProfile, int]:
    """A profile fitted to this machine's engine steps, the engine alone in this process."""
    from llmserve.engine.calibration import measure_steps
    from llmserve.sim.calibrate import calibrate

    template, max_len, engine = engine_template(serve)
    log(f"measuring engine steps: {serve.model}, {serve.threads()} thread(s), max_num_seqs "
        f"{template.max_num_seqs}, max_num_batched_tokens {template.max_num_batched_tokens}")
    profile, fit = calibrate(measure_steps(engine), template)
    log(f"fitted {fit.n} steps: r2 {fit.r2:.3f}, mean abs rel error {fit.mean_abs_rel_error:.1%}; {profile.step}")
    return profile, max_len


def measure_profile_http(serve_dict: dict[str, Any], serve: ServeConfig, tok, workdir: Path, *, seed: int = 0,
                         earlier: Sequence = (), log: Callable[[str], None] = print
                         ) -> tuple[InstanceProfile, int, list]:
    """A profile fitted to what a client sees through serve's HTTP path, one and two instances busy.

    ``earlier`` observations (a measurement before the live run, when this one is after it) are
    fitted with the new ones, so load that moved on a shared machine is averaged over both."""
    from llmserve.engine.threads import available_cores
    from llmserve.sim.http_calibration import fit_http
    from llmserve.fidelity.http_measure import measure_http

    template, max_len, engine = engine_template(serve)
    del engine  # only its limits are needed: the instances measured are serve's own
    shared = serve.autoscale_config().bounds.max_instances > 1
    obs = [*earlier, *measure_http(serve_dict, serve.served_name, tok, workdir, shared=shared, seed=seed,
                                   log=log)]
    fit = fit_http(obs, template, available_cores(), serve.threads())
    p = fit.profile
    log(f"fitted {fit.report.n} HTTP rows: r2 {fit.report.r2:.3f}, mean abs rel error "
        f"{fit.report.mean_abs_rel_error:.1%}; {p.step}; request overhead {p.request_overhead_s:.3f}s; {p.sharing}")
    return p, max_len, obs


def check_lengths(trace: Trace, max_model_len: int) -> None:
    too_long = np.flatnonzero(trace.prompt_tokens + trace.output_tokens > max_model_len)
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(f"fidelity: {len(too_long)} request(s) exceed the model's {max_model_len} tokens "
                         f"(first: #{i}, {trace.prompt_tokens[i]} + {trace.output_tokens[i]}); "
                         "use shorter --prompt-len/--output-len")


# ---- 3. the simulation ------------------------------------------------------------------------------
def simulate_like(serve: ServeConfig, trace: Trace, profile: InstanceProfile, initial: int,
                  seed: int, prompt_chars_per_token: float | None = None) -> SimResult:
    """The simulator set up as serve is: policy, gateway, controller signals, initial pool.
    ``prompt_chars_per_token``: what the live prompts had, so the simulated policy
    sees the live controller's prompt-token estimate (default: the controller's ratio)."""
    gateway = serve.gateway_config(ADMIN_KEY_PLACEHOLDER)
    pool = gateway.models[0]
    ctrl = serve.controller_config()
    sim = SimConfig.like(ctrl, initial_instances=initial, poll_interval_s=gateway.polling.load_interval_s,
                         prompt_chars_per_token=prompt_chars_per_token or ctrl.chars_per_token, seed=seed)
    return Simulator(trace, profile, serve.autoscale_config(), sim, pool.admission, pool.concurrency,
                     pool.balancer, label="sim").run()


# ---- 4. the comparison --------------------------------------------------------------------------------
def live_figures(live: LiveRun, trace: Trace) -> tuple[SideFigures, np.ndarray, np.ndarray]:
    n = len(trace)
    ttft, e2e = np.full(n, np.nan), np.full(n, np.nan)
    for r in live.records:
        if r.success and r.chunk_s:
            ttft[r.index], e2e[r.index] = r.chunk_s[0], r.chunk_s[-1]
    changes = [(d["time"], d["provisioned"], d["desired"]) for d in live.decisions]
    spans = list(spans_from_events(live.events).values())
    window = (live.t0, live.t0 + trace.duration_s)
    return side_figures(ttft, e2e, trace.output_tokens, spans, changes, window), ttft, e2e


def sim_figures(res: SimResult, trace: Trace) -> SideFigures:
    changes = [(t, before, after) for t, before, after, _ in res.events]
    return side_figures(res.ttft, res.e2e, trace.output_tokens, res.lifetimes, changes, (0.0, trace.duration_s))


def live_checks(live: LiveRun, trace: Trace, serve: ServeConfig) -> dict[str, Any]:
    """How faithfully the live side replayed the trace, and what its controller could see."""
    ok = [r for r in live.records if r.success]
    lag = [r.start_s - r.scheduled_s for r in live.records]
    server_prompt = [r.usage_prompt_tokens - r.prompt_len for r in ok if r.usage_prompt_tokens is not None]
    wrong_output = sum(1 for r in ok if r.output_tokens != int(trace.output_tokens[r.index]))
    failures: dict[str, int] = {}
    for r in live.records:
        if not r.success:
            failures[r.failure_label or "?"] = failures.get(r.failure_label or "?", 0) + 1
    return {
        "requests_sent": len(live.records),
        "failures": failures,
        "outputs_not_trace_length": wrong_output,
        "send_lag_p99_s": percentile(np.array(lag), 99) if lag else math.nan,
        "server_minus_trace_prompt_tokens_mean": float(np.mean(server_prompt)) if server_prompt else math.nan,
        # The live controller counts prompt tokens as characters / chars_per_token, and the simulator
        # is given this ratio to make the same estimate. A mismatch skews both demand signals alike.
        "prompt_chars_per_token": prompt_chars_per_token(live, trace),
        "controller_chars_per_token": serve.controller_config().chars_per_token,
        "serve_exit_code": live.exit_code,
    }


def prompt_chars_per_token(live: LiveRun, trace: Trace) -> float:
    return live.prompt_chars / max(1, int(trace.prompt_tokens.sum()))


def redacted(serve_dict: dict[str, Any]) -> dict[str, Any]:
    """The serve config without its keys, for the record."""
    out = {k: v for k, v in serve_dict.items() if k != "admin_key"}
    if isinstance(out.get("gateway"), dict) and "auth" in out["gateway"]:
        out["gateway"] = {**out["gateway"], "auth": "(redacted)"}
    return out


def write_outputs(out: Path, doc: dict, rows: list[Row], trace: Trace, live_ttft: np.ndarray,
                  live_e2e: np.ndarray, res: SimResult) -> list[Path]:
    (out / "fidelity.json").write_text(json.dumps(doc, indent=2, default=float) + "\n")
    (out / "table.md").write_text(markdown(rows))
    with open(out / "requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "arrival_s", "prompt_tokens", "output_tokens", "live_ttft_s", "live_e2e_s",
                    "sim_ttft_s", "sim_e2e_s"])
        for i in range(len(trace)):
            w.writerow([i, f"{trace.arrival_s[i]:.4f}", int(trace.prompt_tokens[i]), int(trace.output_tokens[i]),
                        *(f"{v:.4f}" for v in (live_ttft[i], live_e2e[i], res.ttft[i], res.e2e[i]))])
    with open(out / "trace.csv", "w", newline="") as f:  # the exact trace, to replay with --trace
        w = csv.writer(f)
        w.writerow(["timestamp", "prompt_tokens", "output_tokens", "priority"])
        for row in zip(trace.arrival_s.tolist(), trace.prompt_tokens.tolist(), trace.output_tokens.tolist(),
                       trace.priority.tolist()):
            w.writerow([f"{row[0]:.6f}", *row[1:]])
    return [out / n for n in ("fidelity.json", "table.md", "requests.csv", "trace.csv")]


def run_fidelity(args: argparse.Namespace, trace: Trace) -> int:
    console = Console(stderr=True)
    log = console.print
    st = settings_from_args(args, trace)
    serve = st.serve
    # The profile is measured with one engine on the machine and live runs several plus the
    # gateway and the client: on a shared machine the load average says how far apart they were.
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "load_1m_before_calibration": os.getloadavg()[0]}
    tok = load_tokenizer(model_source(serve))
    observations: list = []
    if st.profile_path:
        profile, max_len = load_profile(st.profile_path), None
    elif st.calibration == "engine":
        profile, max_len = measure_profile(serve, log)
    else:
        with tempfile.TemporaryDirectory(prefix="llmserve-calibration-") as tmp:
            profile, max_len, observations = measure_profile_http(st.serve_dict, serve, tok, Path(tmp),
                                                                   seed=st.seed, log=log)
    if max_len is not None:
        check_lengths(trace, max_len)
    log(f"trace {trace.name}: {len(trace)} requests over {trace.duration_s:.1f}s, peak {trace.peak_rps:.2f} req/s; "
        f"policy {serve.autoscale_config().policy}")
    # A scratch folder: serve's YAML there holds the admin key, which must not land in --out.
    machine["load_1m_before_live"] = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="llmserve-fidelity-") as tmp:
        live = replay_live(trace, st.serve_dict, tok, Path(tmp), seed=st.seed,
                           request_timeout_s=st.request_timeout_s, log=log)
    machine["load_1m_after_live"] = os.getloadavg()[0]
    log(f"load average (1 min) on {machine['cpus']} CPUs: {machine['load_1m_before_calibration']:.1f} before "
        f"calibration, {machine['load_1m_before_live']:.1f} before and {machine['load_1m_after_live']:.1f} "
        "after the live run")
    if observations and st.calibration == "http":  # measured again after, and fitted to both
        with tempfile.TemporaryDirectory(prefix="llmserve-calibration-") as tmp:
            profile, _, observations = measure_profile_http(st.serve_dict, serve, tok, Path(tmp), seed=st.seed + 1,
                                                            earlier=observations, log=log)
        machine["load_1m_after_calibration"] = os.getloadavg()[0]
    ups = startups(live.events)
    cold, warm = typical_startup(ups, live.t0, live.t0 + trace.duration_s)
    profile = replace(profile, cold_start_s=cold, warmup_s=warm)
    log(f"live: {sum(r.success for r in live.records)} of {len(live.records)} completed; cold starts "
        f"{', '.join(f'{s.cold_start_s:.1f}' for s in ups)}s -> simulated {cold:.1f}s (warm-up {warm:.1f}s)")
    res = simulate_like(serve, trace, profile, live.ready_at_start, st.seed, prompt_chars_per_token(live, trace))
    live_fig, live_ttft, live_e2e = live_figures(live, trace)
    sim_fig = sim_figures(res, trace)
    rows = compare(live_fig, sim_fig)
    checks = live_checks(live, trace, serve)
    ratio = checks["prompt_chars_per_token"] / checks["controller_chars_per_token"]
    if not 0.8 <= ratio <= 1.25:
        log(f"note: prompts had {checks['prompt_chars_per_token']:.2f} characters per token; the live controller "
            f"assumes {checks['controller_chars_per_token']:g} (lifecycle.chars_per_token), so its demand signal "
            f"was {1 / ratio:.2f}x the true prompt tokens (the simulator's too: it makes the same estimate)")
    title = (f"fidelity: {trace.name}, {len(trace)} requests over {trace.duration_s:.0f}s, "
             f"policy {serve.autoscale_config().policy}, model {serve.served_name}")
    (Console() if sys.stdout.isatty() else Console(width=120)).print(table(rows, title))
    if st.out:
        st.out.mkdir(parents=True, exist_ok=True)
        safe = redacted(st.serve_dict)
        doc = {"argv": sys.argv[1:], "trace": {"name": trace.name, "requests": len(trace),
                                               "duration_s": trace.duration_s, "peak_rps": trace.peak_rps},
               "serve_config": safe, "profile": json.loads(profile.to_json()),
               "live_startups": [{"instance_id": s.instance_id, "cold_start_s": s.cold_start_s,
                                  "warmup_s": s.warmup_s} for s in ups],
               "live": live_fig.as_dict(), "sim": sim_fig.as_dict(), "rows": [r.as_dict() for r in rows],
               "checks": checks, "machine": machine,
               # Each side's count changes, seconds from the trace's start, with the policy's reason.
               "decisions": {"live": [(round(d["time"] - live.t0, 2), d["provisioned"], d["desired"], d["reason"])
                                      for d in live.decisions if d["time"] >= live.t0],
                             "sim": [(round(t, 2), a, b, why) for t, a, b, why in res.events]}}
        save_profile(profile, st.out / "profile.json")
        if observations:
            from llmserve.fidelity.http_measure import write_observations

            write_observations(st.out / "calibration.csv", observations)
        (st.out / "serve.log").write_text(live.serve_log)
        for p in write_outputs(st.out, doc, rows, trace, live_ttft, live_e2e, res):
            log(f"wrote {p}")
    return 0 if checks["requests_sent"] == len(trace) and not checks["failures"] else 1
