"""What a canary configuration guarantees: promote and rollback probabilities from many
seeded rollouts of the live analysis (``gateway/canary.py``, the very class the gateway
runs), fed synthetic outcome streams.

One rollout: the analysis starts; each ``interval_s`` a Poisson number of requests
arrives, split between the versions by the canary's current weight; each version's
requests fail at its error rate, and the successful ones get lognormal TTFT and TPOT
(the canary's scaled by its slowdown) and a fixed output length; the batch goes into
the analysis's evidence and the analysis looks. The rollout ends at a verdict or at
``max_s`` (undecided). ``llmserve simulate --canary-power`` prints the table
(docs/canary.md explains how to read it).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml
from pydantic import ValidationError

from llmserve.gateway.canary import CanaryAnalysis, CanaryConfig, CanaryState


@dataclass(frozen=True, slots=True)
class Traffic:
    """The traffic and the two versions' behaviour in a scenario."""

    rps: float = 10.0  # both versions together
    stable_error_rate: float = 0.0
    canary_error_rate: float = 0.0
    ttft_s: float = 0.05  # median
    tpot_s: float = 0.01  # median
    sigma: float = 0.3  # lognormal spread of both latencies
    canary_slowdown: float = 1.0  # the canary's latencies times this
    output_tokens: int = 16
    canary_output_tokens: int | None = None  # None: the same as stable's
    max_s: float = 3600.0  # a rollout still undecided then counts as undecided


@dataclass(frozen=True, slots=True)
class Rollout:
    state: str  # promoted, rolled_back or progressing (undecided)
    seconds: float  # time to the verdict (or max_s)


@dataclass(frozen=True, slots=True)
class Power:
    scenario: str
    rollouts: int
    promoted: float  # shares of the rollouts
    rolled_back: float
    undecided: float
    median_s: float | None  # time to a verdict, over the decided rollouts
    p95_s: float | None


# The analysis reads no more samples of a signal once it has passed in this step.
SAMPLED = frozenset({"TTFT", "TPOT", "e2e", "output tokens"})


def _batch(rng: np.random.Generator, n: int, error_rate: float, traffic: Traffic,
           slowdown: float, tokens: int, sampled: bool) -> dict:
    errors = int(rng.binomial(n, error_rate)) if n else 0
    ok = n - errors
    if not sampled:
        return {"requests": n, "errors": {"upstream_5xx": errors} if errors else None}
    ttft = traffic.ttft_s * slowdown * rng.lognormal(0.0, traffic.sigma, ok)
    tpot = traffic.tpot_s * slowdown * rng.lognormal(0.0, traffic.sigma, ok)
    return {"requests": n, "errors": {"upstream_5xx": errors} if errors else None,
            "ttft_s": ttft.tolist(), "tpot_s": tpot.tolist(),
            "e2e_s": (ttft + tpot * (tokens - 1)).tolist(), "output_tokens": [tokens] * ok}


def rollout(config: CanaryConfig, traffic: Traffic, seed: int) -> Rollout:
    """One seeded rollout of the real analysis."""
    rng = np.random.default_rng(seed)
    a = CanaryAnalysis("canary", "stable", config)
    a.start(0.0)
    t, dt = 0.0, config.interval_s
    canary_tokens = traffic.canary_output_tokens or traffic.output_tokens
    while a.state is CanaryState.PROGRESSING and t < traffic.max_s:
        n = int(rng.poisson(traffic.rps * dt))
        nc = int(rng.binomial(n, a.weight))
        sampled = not SAMPLED <= a.settled.keys()
        for version, k, rate, slow, tokens in (
                ("canary", nc, traffic.canary_error_rate, traffic.canary_slowdown, canary_tokens),
                ("stable", n - nc, traffic.stable_error_rate, 1.0, traffic.output_tokens)):
            a.evidence[version].add_counts(t + dt / 2, **_batch(rng, k, rate, traffic, slow, tokens, sampled))
        t += dt
        a.tick(t)
    return Rollout(a.state.value, t)


def power(config: CanaryConfig, traffic: Traffic, rollouts: int = 1000, seed: int = 0,
          scenario: str = "") -> Power:
    """Shares of ``rollouts`` seeded rollouts that promote, roll back, or stay undecided."""
    runs = [rollout(config, traffic, seed * 1_000_003 + i) for i in range(rollouts)]
    decided = [r.seconds for r in runs if r.state != CanaryState.PROGRESSING.value]
    share = {s: sum(r.state == s for r in runs) / rollouts
             for s in ("promoted", "rolled_back", "progressing")}
    return Power(scenario, rollouts, share["promoted"], share["rolled_back"], share["progressing"],
                 float(np.median(decided)) if decided else None,
                 float(np.percentile(decided, 95)) if decided else None)


def scenarios(base: Traffic, worse_by: list[float], slower_by: list[float]) -> dict[str, Traffic]:
    """The healthy canary, then one worse by each error-rate delta and slowdown."""
    out = {"healthy": base}
    for d in worse_by:
        out[f"errors +{d:g}"] = _with(base, canary_error_rate=min(1.0, base.stable_error_rate + d))
    for f in slower_by:
        out[f"{f:g}x slower"] = _with(base, canary_slowdown=f)
    return out


def _with(t: Traffic, **kw) -> Traffic:
    return Traffic(**{**asdict(t), **kw})


def add_canary_power_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("canary power (instead of a policy comparison)")
    g.add_argument("--canary-power", action="store_true",
                   help="print the probability that the canary analysis promotes or rolls back a healthy "
                   "canary and worse ones, from seeded rollouts of the gateway's own analysis")
    g.add_argument("--canary-settings", default=None, metavar="YAML",
                   help="the canary settings: a gateway or serve file (its first model's canary:), "
                   "a file of canary fields, or an inline mapping such as '{min_requests: 3, interval_s: 1}'; "
                   "default: the gateway's defaults")
    g.add_argument("--canary-rps", type=float, default=10.0, help="requests/s, both versions")
    g.add_argument("--canary-stable-error-rate", type=float, default=0.01)
    g.add_argument("--canary-worse-by", default="0.05,0.6", metavar="D,...",
                   help="error-rate deltas of the bad canaries (absolute)")
    g.add_argument("--canary-slower-by", default="2", metavar="F,...", help="latency factors of the slow canaries")
    g.add_argument("--canary-rollouts", type=int, default=1000)
    g.add_argument("--canary-max-s", type=float, default=3600.0, help="a rollout's time limit")


def _settings(spec: str | None) -> CanaryConfig:
    if not spec:
        return CanaryConfig()
    path = Path(spec)
    inline = not path.is_file()
    if inline and not any(c in spec for c in "{}:\n") and (path.suffix in (".yaml", ".yml", ".json") or "/" in spec):
        # A path that is not there would otherwise be read as inline YAML: a bare string.
        raise ValueError(f"--canary-settings: no such file {spec}")
    try:
        data = yaml.safe_load(spec if inline else path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"--canary-settings: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--canary-settings: expected a mapping of canary fields or a file, got {spec!r}")
    if "models" in data:  # a gateway or serve file: its first canary
        canaries = [m["canary"] for m in data["models"] or [] if isinstance(m, dict) and m.get("canary")]
        if not canaries:
            raise ValueError(f"--canary-settings: {spec}: no model has a canary")
        data = {k: v for k, v in canaries[0].items() if k in CanaryConfig.model_fields}
    try:
        return CanaryConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"--canary-settings: {where}: {err['msg']}") from None


def _floats(flag: str, spec: str) -> list[float]:
    try:
        return [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {spec!r}") from None


def _check(args: argparse.Namespace) -> None:
    if args.canary_rollouts < 1:  # the shares divide by it
        raise ValueError(f"--canary-rollouts must be >= 1, got {args.canary_rollouts}")
    if not (args.canary_rps > 0 and math.isfinite(args.canary_rps)):
        raise ValueError(f"--canary-rps must be a positive number, got {args.canary_rps:g}")
    if not 0 <= args.canary_stable_error_rate <= 1:
        raise ValueError(f"--canary-stable-error-rate must be in [0, 1], got {args.canary_stable_error_rate:g}")
    if not (args.canary_max_s > 0 and math.isfinite(args.canary_max_s)):
        raise ValueError(f"--canary-max-s must be a positive number of seconds, got {args.canary_max_s:g}")


def run_canary_power(args: argparse.Namespace) -> int:
    _check(args)
    config = _settings(args.canary_settings)
    base = Traffic(rps=args.canary_rps, stable_error_rate=args.canary_stable_error_rate,
                   canary_error_rate=args.canary_stable_error_rate, max_s=args.canary_max_s)
    rows = [power(config, traffic, args.canary_rollouts, args.seed, name)
            for name, traffic in scenarios(base, _floats("--canary-worse-by", args.canary_worse_by),
                                           _floats("--canary-slower-by", args.canary_slower_by)).items()]
    print(markdown(config, base, rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "canary_power.json").write_text(json.dumps(
            {"settings": config.model_dump(), "traffic": asdict(base),
             "scenarios": [asdict(r) for r in rows]}, indent=2))
    return 0


def markdown(config: CanaryConfig, base: Traffic, rows: list[Power]) -> str:
    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    lines = [f"canary power: {rows[0].rollouts if rows else 0} seeded rollouts per scenario at "
             f"{base.rps:g} req/s, stable error rate {base.stable_error_rate:g}, confidence "
             f"{config.confidence:g}, steps {config.steps()}, interval {config.interval_s:g} s", "",
             "| canary | promoted | rolled back | undecided | median s to verdict | p95 s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.scenario} | {r.promoted:.1%} | {r.rolled_back:.1%} | {r.undecided:.1%} | "
              f"{secs(r.median_s)} | {secs(r.p95_s)} |" for r in rows]
    return "\n".join(lines)
