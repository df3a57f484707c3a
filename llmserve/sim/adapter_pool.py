"""One pool serving several versions: the base and the LoRA adapter versions on it.

In a deployment replay (:mod:`llmserve.sim.deployment`) each pool runs once over
the requests of every version its instances serve, in arrival order, each
request carrying its version's adapter (the simulator places and delays it as
:mod:`llmserve.sim.adapters` says). The run is then read per version, so the
canary analysis judges an adapter canary on its own requests, exactly as a full
version; the pool's instances (its cost, its timeline's capacity) belong to the
base version, since the adapters ride on them and cost nothing more.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from llmserve.sim.results import SimRecord
from llmserve.sim.traces import Trace


def merge(name: str, shares: dict[str, Trace]) -> tuple[Trace, np.ndarray]:
    """The versions' requests as one trace in arrival order, and each request's version."""
    parts = list(shares.items())
    version = np.concatenate([np.full(len(t), v, dtype=object) for v, t in parts])
    cols = {c: np.concatenate([getattr(t, c) for _, t in parts])
            for c in ("arrival_s", "prompt_tokens", "output_tokens", "priority")}
    order = np.argsort(cols["arrival_s"], kind="stable")
    duration = max(t.duration_s for _, t in parts)
    return Trace(name, *(cols[c][order] for c in ("arrival_s", "prompt_tokens", "output_tokens", "priority")),
                 duration), version[order]


def split(record: SimRecord, version: np.ndarray, base: str, model: str) -> dict[str, SimRecord]:
    """The merged run's record per version (labelled ``model/version``); the instances are ``base``'s alone."""
    out = {}
    for v in dict.fromkeys(version.tolist()) | {base: None}:
        keep = version == v
        t = record.trace
        trace = Trace(f"{t.name}/{v}", t.arrival_s[keep], t.prompt_tokens[keep], t.output_tokens[keep],
                      t.priority[keep], t.duration_s)
        own = {} if v == base else {"events": [], "lifetimes": {}, "classes": {}, "reclaims": 0}
        out[v] = dataclasses.replace(record, label=f"{model}/{v}", trace=trace, status=record.status[keep], ttft=record.ttft[keep],
                                     e2e=record.e2e[keep], **own)
    return out
