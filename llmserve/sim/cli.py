"""``llmserve simulate``: flags, and the run from flags to table, JSON and plots.

The top-level CLI calls :func:`add_simulate_args` on its ``simulate`` sub-parser
and :func:`run_simulate` with the parsed namespace; ``python -m llmserve.sim``
runs the same thing standalone. :data:`EXAMPLES` is the help's epilog.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console

from llmserve.autoscale import AutoscaleConfig, BoundsConfig, SLOConfig
from llmserve.autoscale.config import POLICY_NAMES
from llmserve.engine.threads import available_cores
from llmserve.gateway.balancer import columns
from llmserve.serve.deployment import deep_merge
from llmserve.flags import add_flags, given
from llmserve.sim.calibrate import calibrate, read_measurements
from llmserve.sim.canary_power import add_canary_power_args, run_canary_power
from llmserve.sim.cli_checks import check_simulate_args, lengths, static_instances
from llmserve.sim.compare import initial_instances, size_static_for_peak
from llmserve.sim.jobs import ORACLE, RunProgress, run_jobs
from llmserve.sim.plots import write_plots
from llmserve.sim.profile import BUILTIN_PROFILES, DEFAULT_PROFILE, load_profile, save_profile
from llmserve.sim.report import markdown_table, print_comparison, write_summaries
from llmserve.sim.simulator import SimConfig
from llmserve.sim.traces import TRACE_NAMES, build_trace


EXAMPLES = """\
examples:
  llmserve simulate --trace diurnal --policy threshold,kpa,predictive,static --cold-start 120
  llmserve simulate --trace diurnal --policy predictive --cold-start 120 --spot-max 64 \\
      --reclaim-rate-per-h 0.05 --reclaim-notice-s 120      # on-demand base, spot burst
  llmserve simulate --calibrate steps.csv --profile cpu-smollm2 --write-profile my.json
  llmserve simulate --canary-power --canary-settings gateway.yaml   # docs/canary.md

fidelity check (--fidelity): replay one compressed trace through a live
`llmserve serve` (started here as a child process, from the same YAML it takes)
and through the simulator, and compare TTFT/e2e percentiles, TPOT,
instance-seconds, peak instances and scale-ups/downs. The instance profile is
measured on the served model first (same engine flags and threads), the cold
start is the one measured live, and the policy, gateway and controller settings
come from the serve config: the pool flags are not used.

  llmserve simulate --fidelity --serve-config serve.yaml --trace ramp \\
      --base-rps 0.004 --high-rps 0.03 --time-scale 150 \\
      --prompt-len 24:0.5 --output-len 16:0.5 --out DIR
"""


# The simulator judges e2e over 5 minutes (the library's default, 60 s, is the live gateway's).
SIM_SLO = {"e2e_s": 300.0}
NOT_AUTOSCALE_FLAGS = frozenset({"policy"})  # --policy: a list of them, oracle too


def add_simulate_args(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags (and the examples, as the help's epilog) to ``parser``."""
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    g = parser.add_argument_group("trace")
    g.add_argument("--trace", default="diurnal", help=f"{', '.join(TRACE_NAMES)} or a CSV file "
                   "(timestamp,prompt_tokens,output_tokens[,priority])")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--hours", type=float, default=None, help="diurnal/bursty: trace length (default 24 / 4)")
    g.add_argument("--peak-rps", type=float, default=None, help="diurnal: peak arrival rate (req/s)")
    g.add_argument("--peak-to-trough", type=float, default=10.0, help="diurnal: peak / trough rate")
    g.add_argument("--base-rps", type=float, default=None, help="bursty: base rate; ramp: low rate")
    g.add_argument("--high-rps", type=float, default=None, help="ramp: high rate")
    g.add_argument("--prompt-len", default=None, metavar="MEDIAN[:SIGMA]",
                   help="log-normal prompt tokens (default 300:0.8)")
    g.add_argument("--output-len", default=None, metavar="MEDIAN[:SIGMA]",
                   help="log-normal output tokens (default 400:0.8)")
    g.add_argument("--batch-fraction", type=float, default=0.0, help="share of requests in the batch class")
    g.add_argument("--time-scale", type=float, default=1.0, metavar="F",
                   help="play the trace F times faster (times / F, rates x F, lengths kept), e.g. to replay "
                   "the 90-minute ramp live in a minute")

    g = parser.add_argument_group("pool")
    g.add_argument("--policy", default="threshold,kpa,predictive,static",
                   help=f"comma-separated, from {', '.join(POLICY_NAMES)}, and oracle (the cheapest "
                        "schedule meeting --oracle-target with perfect knowledge of the trace)")
    g.add_argument("--oracle-target", type=float, default=0.999,
                   help="TTFT attainment the oracle's schedule must meet (default 0.999)")
    g.add_argument("--profile", default=DEFAULT_PROFILE, help=f"{', '.join(BUILTIN_PROFILES)} or a JSON file")
    g.add_argument("--cold-start", type=float, default=None, help="seconds from start to ready (default: profile's)")
    g.add_argument("--static-instances", default="auto",
                   help="static pool size, or 'auto': the smallest meeting the TTFT SLO in the peak hour")
    g.add_argument("--initial-instances", type=int, default=None,
                   help="elastic pools' size at t=0 (default: what the peak-sized pool needs at t=0)")
    add_flags(g, BoundsConfig)
    add_flags(g, AutoscaleConfig, skip=NOT_AUTOSCALE_FLAGS)
    add_flags(g, SLOConfig, defaults=SIM_SLO)
    g.add_argument("--capacity-prior", type=float, default=None,
                   help="predictive: prior saturation tokens/s per instance (default: from the profile)")
    g.add_argument("--autoscale-config", default=None, metavar="YAML",
                   help="an autoscale section (policy parameters, bounds); flags above override it")

    g = parser.add_argument_group("capacity classes (autoscale.capacity; cost in money beside instance-hours)")
    g.add_argument("--on-demand-price", type=float, default=None, help="$ per on-demand instance-hour (default 1.00)")
    g.add_argument("--spot-price", type=float, default=None, help="$ per spot instance-hour (default 0.35)")
    g.add_argument("--spot-max", type=int, default=None, metavar="N",
                   help="spot instances at most (default 0: no spot); the base (--min-instances) stays on-demand")

    # --seed (the trace's) seeds the simulator too.
    add_flags(parser.add_argument_group("simulator"), SimConfig, skip=frozenset({"seed"}))

    g = parser.add_argument_group("output")
    g.add_argument("--out", default=None, metavar="DIR", help="write summary.json, table.md and PNG plots here")
    g.add_argument("--no-plots", action="store_true")
    g.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="run the policies (the oracle too), and the static sizing's tries, N at a time in "
                        "separate processes, results merged into one table (default: one per core, at most "
                        "one per policy; 1: all in this process)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars (simulated time, requests/s)")

    g = parser.add_argument_group("fidelity check (instead of a policy comparison)")
    g.add_argument("--fidelity", action="store_true",
                   help="replay the trace through a live `llmserve serve` and through the simulator; "
                   "print live vs sim (TTFT, e2e, instance-seconds, peak, scale-ups); --out writes "
                   "fidelity.json, table.md, requests.csv, trace.csv, profile.json, serve.log (and calibration.csv)")
    g.add_argument("--fidelity-long", action="store_true",
                   help="fidelity: run a live replay longer than an hour (refused otherwise)")
    g.add_argument("--serve-config", default=None, metavar="YAML",
                   help="fidelity: the YAML `llmserve serve --config` takes (default: serve's defaults)")
    g.add_argument("--model", default=None, help="fidelity: the model to serve (overrides the serve config's)")
    g.add_argument("--fidelity-calibration", choices=("http", "http-before", "engine"), default="http",
                   help="fidelity: measure the profile through serve's HTTP path with one and two instances busy "
                   "(request overhead and core sharing fitted), before and after the live run (http, default: "
                   "a shared machine's load moves) or before only; or the engine alone in this process (engine)")
    g.add_argument("--fidelity-profile", default=None, metavar="JSON",
                   help="fidelity: use this profile's step model and limits instead of measuring the engine "
                   "(its cold start is still replaced by the live one)")

    g = parser.add_argument_group("deployment (instead of a policy comparison)")
    g.add_argument("--deployment", default=None, metavar="YAML",
                   help="replay a `llmserve serve` file with models: (docs/deployments.md): the trace split over "
                   "the versions by their starting weights, each pool with its own autoscale config")
    g.add_argument("--deployment-model", default=None, help="deployment: the served model the trace is for "
                   "(default: the file's first)")
    g.add_argument("--adapter-load-s", type=float, default=0.2, help="deployment: seconds a LoRA adapter version's "
                   "adapter takes to load on an instance that lacks it (docs/lora-versions.md)")

    add_canary_power_args(parser)

    g = parser.add_argument_group("calibration (instead of a simulation)")
    g.add_argument("--calibrate", default=None, metavar="CSV",
                   help="fit --profile's step model to measured steps "
                   "(prefill_tokens,decode_seqs,sum_context,seconds) and write --write-profile")
    g.add_argument("--write-profile", default=None, metavar="JSON")


def trace_from_args(args: argparse.Namespace):
    return _trace_from_args(args).compressed(args.time_scale)


def _trace_from_args(args: argparse.Namespace):
    from llmserve.sim.traces import default_output_lengths, default_prompt_lengths

    if args.trace.endswith(".csv"):
        return build_trace(args.trace)
    check_simulate_args(args)  # before anything is built: also for --fidelity and --deployment
    kw: dict = {"prompt": lengths("--prompt-len", args.prompt_len, default_prompt_lengths()),
                "output": lengths("--output-len", args.output_len, default_output_lengths()),
                "batch_fraction": args.batch_fraction}
    # `is None`, not truthiness: a given 0 is refused above, never taken for the default.
    if args.trace == "diurnal":
        kw["ratio"] = args.peak_to_trough
        if args.peak_rps is not None:
            kw["peak_rps"] = args.peak_rps
        if args.hours is not None:
            kw["duration_s"] = args.hours * 3600.0
    elif args.trace in ("bursty", "flash"):
        if args.base_rps is not None:
            kw["base_rps"] = args.base_rps
        if args.hours is not None:
            kw["duration_s"] = args.hours * 3600.0
    elif args.trace == "ramp":
        if args.base_rps is not None:
            kw["low_rps"] = args.base_rps
        if args.high_rps is not None:
            kw["high_rps"] = args.high_rps
    return build_trace(args.trace, seed=args.seed, **kw)


FIDELITY_MAX_S = 3600.0  # longer live replays need --fidelity-long


def fidelity_trace(args: argparse.Namespace):
    """The trace a fidelity check replays live: one longer than an hour only when asked
    for (the default diurnal day would otherwise run a day-long live check unannounced)."""
    trace = trace_from_args(args)
    if trace.duration_s > FIDELITY_MAX_S and not getattr(args, "fidelity_long", False):
        raise ValueError(f"--fidelity would replay {trace.name} live for {trace.duration_s / 3600:.1f} h: "
                         "shorten it (--time-scale F, --hours, a CSV) or pass --fidelity-long to run it anyway")
    return trace


def autoscale_from_args(args: argparse.Namespace, profile, trace) -> AutoscaleConfig:
    """The simulator's defaults, under --autoscale-config's file, under the flags given."""
    file = (yaml.safe_load(Path(args.autoscale_config).read_text()) or {}) if args.autoscale_config else {}
    flags = {**given(AutoscaleConfig, args, skip=NOT_AUTOSCALE_FLAGS), "slo": given(SLOConfig, args),
             "bounds": given(BoundsConfig, args), "capacity": capacity_from_args(args)}
    d = deep_merge(deep_merge({"slo": SIM_SLO}, file), flags)
    tick_s = AutoscaleConfig.model_validate(d).tick_s
    mean_p = float(np.mean(trace.prompt_tokens)) if len(trace) else 300.0
    mean_o = float(np.mean(trace.output_tokens)) if len(trace) else 200.0
    prior = args.capacity_prior if args.capacity_prior is not None else profile.saturation_tokens_per_s(mean_p, mean_o)
    # KPA's target is 70 % of the seats the instances report, live and here alike.
    return AutoscaleConfig.model_validate(deep_merge(d, {"predictive": {
        "capacity_tokens_per_s": prior, "lead_time_s": profile.cold_start_s + tick_s + 5.0}}))


def capacity_from_args(args: argparse.Namespace) -> dict:
    """The capacity flags given, shaped like ``autoscale.capacity``."""
    def some(**kw) -> dict:
        return {k: v for k, v in kw.items() if v is not None}

    return {"on_demand": some(price_per_hour=args.on_demand_price),
            "spot": some(price_per_hour=args.spot_price, max_instances=args.spot_max)}


def profile_from_args(args: argparse.Namespace):
    profile = load_profile(args.profile)
    return profile.with_cold_start(args.cold_start) if args.cold_start is not None else profile


def sim_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(**given(SimConfig, args))


def run_calibrate(args: argparse.Namespace) -> int:
    template = load_profile(args.profile)
    profile, fit = calibrate(read_measurements(args.calibrate), template)
    if not args.write_profile:
        print("--calibrate needs --write-profile PATH", file=sys.stderr)
        return 2
    save_profile(profile, args.write_profile)
    print(f"fitted {fit.n} steps: r2 {fit.r2:.4f}, rmse {fit.rmse_s * 1e3:.2f} ms, "
          f"mean abs rel error {fit.mean_abs_rel_error:.1%}; wrote {args.write_profile}")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    """Run every requested policy over the trace; print and optionally write the comparison."""
    if args.calibrate:
        return run_calibrate(args)
    if args.fidelity:
        from llmserve.fidelity.fidelity_check import run_fidelity

        return run_fidelity(args, fidelity_trace(args))
    if args.deployment:
        return run_deployment(args)
    if args.canary_power:
        return run_canary_power(args)
    console = Console(stderr=True)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in (*POLICY_NAMES, ORACLE)]
    if unknown or not policies:
        console.print(f"[red]unknown policies {unknown}; use {', '.join(POLICY_NAMES)} or oracle[/red]")
        return 2
    if args.jobs is not None and args.jobs < 1:
        console.print("[red]--jobs must be >= 1[/red]")
        return 2
    cores = available_cores()
    jobs = args.jobs or min(cores, len(policies))
    profile = profile_from_args(args)
    trace = trace_from_args(args)
    too_long = int(np.sum(trace.prompt_tokens + trace.output_tokens > profile.kv_capacity_tokens))
    if too_long == len(trace) and too_long:
        raise ValueError(f"every request of the trace is longer than {profile.name}'s KV capacity "
                         f"({profile.kv_capacity_tokens} tokens): an instance would refuse them all")
    autoscale = autoscale_from_args(args, profile, trace)
    sim = sim_from_args(args)
    console.print(f"trace {trace.name}: {len(trace)} requests over {trace.duration_s / 3600:.1f} h, "
                  f"peak {trace.peak_rps:.2f} req/s; profile {profile.name}, cold start {profile.cold_start_s:g}s")
    if not columns.COMPILED:  # the same decisions, about 1.4x the time (benchmarks/sim/fleet.md)
        console.print("the picker's compiled score is not built (no compiler at install): "
                      "its Python path decides the same, more slowly")

    if too_long:
        console.print(f"{too_long} requests are longer than the KV capacity ({profile.kv_capacity_tokens} "
                      "tokens): refused at once, as the engine answers them 400, and counted as rejected")
    log = console.print
    static_n = static_instances(args.static_instances)
    if static_n is None and ("static" in policies or args.initial_instances is None):
        try:
            static_n, _ = size_static_for_peak(trace, profile, autoscale, sim, log=log, jobs=args.jobs or cores)
        except ValueError as e:
            if "static" in policies:
                raise
            raise ValueError(f"--initial-instances defaults to what the peak-sized static pool needs at t=0, "
                             f"and sizing that pool failed: {e} or --initial-instances N") from None
    start = (args.initial_instances if args.initial_instances is not None
             else initial_instances(trace, static_n, autoscale.bounds.min_instances))
    static_n = static_n or 1  # not asked for and not sized: no run uses it
    with RunProgress(trace.duration_s, console, enabled=not args.no_progress) as bars:
        results = run_jobs(trace, profile, autoscale, sim, policies, static_n, start, jobs, bars, log=log,
                           oracle_target=args.oracle_target)
    summaries = [r.summary for r in results]
    table_console = Console() if sys.stdout.isatty() else Console(width=200)
    print_comparison(summaries, title=f"{trace.name}, {profile.name}, cold start {profile.cold_start_s:g}s, "
                     f"TTFT SLO {autoscale.slo.ttft_s:g}s", console=table_console)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"argv": sys.argv[1:],
                "trace": trace.name, "requests": len(trace), "profile": profile.name,
                "cold_start_s": profile.cold_start_s,
                "static_instances": static_n if "static" in policies else None,
                "initial_instances": start, "slo": {"ttft_s": autoscale.slo.ttft_s, "e2e_s": autoscale.slo.e2e_s},
                "capacity": autoscale.capacity.model_dump(), "reclaim_rate_per_h": sim.reclaim_rate_per_h,
                "reclaim_notice_s": sim.reclaim_notice_s}
        write_summaries(summaries, out / "summary.json", meta)
        (out / "table.md").write_text(markdown_table(summaries))
        if not args.no_plots:
            for p in write_plots(trace, results, out):
                console.print(f"wrote {p}")
    return 0


def run_deployment(args: argparse.Namespace) -> int:
    from llmserve.serve.serve_config import ServeConfig
    from llmserve.sim.deployment import replay_deployment, starting_weights

    serve = ServeConfig.load(args.deployment)
    profile = load_profile(args.profile)
    if args.cold_start is not None:
        profile = profile.with_cold_start(args.cold_start)
    trace = trace_from_args(args)
    model = args.deployment_model or serve.pools()[0].model
    results, rollout = replay_deployment(serve, trace, profile, model, seed=args.seed,
                                         adapter_load_s=args.adapter_load_s)
    weights = ", ".join(f"{v} {w:.0%}" for v, w in starting_weights(serve, model).items())
    if rollout is not None:  # the canary's replayed rollout: where it ended
        last = rollout.events[-1]
        weights += f"; canary {last['state']} at {last['weight']:.0%} after {len(rollout.events) - 1} checks"
    table_console = Console() if sys.stdout.isatty() else Console(width=200)
    print_comparison([r.summary for r in results.values()], console=table_console,
                     title=f"{trace.name} over {model} ({weights}), {profile.name}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        summaries = [r.summary for r in results.values()]
        write_summaries(summaries, out / "summary.json", {"argv": sys.argv[1:], "deployment": args.deployment})
        (out / "table.md").write_text(markdown_table(summaries))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmserve simulate",
                                     description="Capacity simulator: replay traffic through the live policies.")
    add_simulate_args(parser)
    return run_simulate(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
