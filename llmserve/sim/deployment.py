"""Replay a multi-version deployment (``llmserve serve``'s ``models:`` file) in the simulator.

Each request of the trace (one served model's traffic) is given a version by the
gateway's own :class:`~llmserve.gateway.version_router.VersionRouter`. Each pool
runs the ordinary one-pool simulator on its share, with its own ``autoscale``
(the file's, merged per version) and the controller and gateway settings of the
same file. So the capacity each weight split needs, and its cost, come out per
pool. A canary that starts with the gateway has its rollout replayed
(:mod:`llmserve.sim.canary_replay`: the live analysis on the simulated outcomes
moves the weights); ``rollout=False`` holds the starting weights all day.

Not simulated: foreign ``command`` versions (no profile of them).
"""

from __future__ import annotations

import random

import numpy as np

from llmserve.serve.serve_config import ServeConfig
from llmserve.gateway.version_router import VersionRouter, with_weight
from llmserve.sim.adapter_pool import merge, split
from llmserve.sim.adapters import SimAdapters
from llmserve.sim.canary_replay import Rollout, replay
from llmserve.sim.profile import InstanceProfile
from llmserve.sim.results import SimResult
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace

_ADMIN_PLACEHOLDER = "simulated-admin-key-0000"


def model_config(gateway, model: str):
    """``model``'s gateway config; a name the file does not serve is one line naming those it does."""
    found = next((m for m in gateway.models if m.name == model), None)
    if found is None:
        raise ValueError(f"--deployment-model {model!r}: the file serves no such model; it serves "
                         f"{', '.join(repr(m.name) for m in gateway.models)}")
    return found


def starting_weights(serve: ServeConfig, model: str) -> dict[str, float]:
    """The version weights the gateway starts ``model`` with."""
    m = model_config(serve.gateway_config(_ADMIN_PLACEHOLDER), model)
    c = m.canary
    if c is None or not c.auto_start:
        return m.base_weights
    return with_weight(m.base_weights, c.version, c.start_weight)


def split_trace(trace: Trace, weights: dict[str, float], seed: int) -> dict[str, Trace]:
    """Each request to a version, as the gateway splits anonymous requests."""
    router = VersionRouter(weights, rng=random.Random(seed))
    picks = np.array([router.route().version for _ in range(len(trace))], dtype=object)
    out = {}
    for version in weights:
        keep = picks == version
        out[version] = Trace(f"{trace.name}/{version}", trace.arrival_s[keep], trace.prompt_tokens[keep],
                             trace.output_tokens[keep], trace.priority[keep], trace.duration_s)
    return out


def simulate_deployment(serve: ServeConfig, trace: Trace, profile: InstanceProfile,
                        model: str | None = None, seed: int = 0, rollout: bool = True) -> dict[str, SimResult]:
    """Every pool of ``model`` (default: the file's first) over its share of ``trace``,
    by pool key (``model/version``)."""
    return replay_deployment(serve, trace, profile, model, seed, rollout)[0]


def replay_deployment(serve: ServeConfig, trace: Trace, profile: InstanceProfile, model: str | None = None,
                      seed: int = 0, rollout: bool = True, adapter_load_s: float = 0.2
                      ) -> tuple[dict[str, SimResult], Rollout | None]:
    """:func:`simulate_deployment`'s results, and the canary's replayed rollout (None
    without a canary that starts with the gateway, or with ``rollout=False``). A LoRA
    adapter version runs on its pool (:mod:`llmserve.sim.adapter_pool`), each load
    taking ``adapter_load_s``."""
    pools = serve.pools()
    model = model or pools[0].model
    gateway = serve.gateway_config(_ADMIN_PLACEHOLDER)
    cfg = model_config(gateway, model)
    ctrl = serve.controller_config()
    mine = [p for p in pools if p.model == model]
    for p in mine:
        if p.command:
            raise ValueError(f"{p.key}: a foreign command version has no instance profile to simulate")

    def simulate(shares: dict[str, Trace]) -> dict[str, SimResult]:
        out = {}
        for p in mine:
            auto = serve.autoscale_config(p)
            sim = SimConfig.like(ctrl, initial_instances=auto.bounds.min_instances,
                                 poll_interval_s=gateway.polling.load_interval_s, seed=seed)
            if not p.adapter_versions:
                out[p.version] = Simulator(shares[p.version], profile, auto, sim, cfg.admission, cfg.concurrency,
                                           cfg.balancer, label=p.key).run()
                continue
            # The adapter versions' requests run on this pool, each with its adapter.
            trace_p, version = merge(p.key, {v: shares[v] for v in (p.version, *p.adapter_versions)})
            names = {v: cfg.version(v).adapter.name for v in p.adapter_versions}
            run = Simulator(trace_p, profile, auto, sim, cfg.admission, cfg.concurrency, cfg.balancer, label=p.key,
                            adapters=SimAdapters(shares={}, load_s=adapter_load_s),
                            adapter_of=[names.get(v) for v in version.tolist()])
            res = run.run()
            for v, rec in split(run.record(), version, p.version, p.model).items():
                out[v] = SimResult.build(rec, res.summary.wall_s, res.summary.cpu_s)
        return out

    c = cfg.canary
    if not rollout or c is None or not c.auto_start:
        by_version, replayed = simulate(split_trace(trace, starting_weights(serve, model), seed)), None
    else:
        replayed = replay(c, c.version, c.stable, cfg.base_weights, trace, seed, simulate)
        by_version = replayed.results
    return {f"{model}/{v}": r for v, r in by_version.items()}, replayed
