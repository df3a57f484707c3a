"""What the canary analysis judges: every outcome of both versions since the current
step began, accumulated, never a rolling window.

Outcomes arrive one at a time from the live request path (the recorder) or in
batches from the simulator; both land in :class:`VersionEvidence`, which keeps
counters (requests, errors by kind, refusals) and the per-request samples the rank
tests need (TTFT, TPOT per token, end-to-end, output tokens). Each arrival is a
*segment* stamped with its time, so the outcomes of an interval the analysis may not
judge (the canary pool was cold) can be taken back out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Outcome:
    """One upstream attempt of one version, as the analysis sees it.

    ``error`` is the kind of an upstream fault (``upstream_5xx``, ``upstream_broken``,
    a timeout, ...) or None; ``refused``: the version answered 4xx to a request it was
    sent. Latencies and tokens are those of a successful answer (None otherwise)."""

    error: str | None = None
    refused: bool = False
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int | None = None


class OutcomeSink(Protocol):
    """Where the request path sends outcomes (the canary analysis)."""

    def record(self, version: str, now: float, outcome: Outcome) -> None: ...


SAMPLES = ("ttft_s", "tpot_s", "e2e_s", "output_tokens")


@dataclass(slots=True)
class _Segment:
    t: float
    requests: int
    errors: Counter
    refusals: int
    samples: dict[str, list[float]]
    kept: int = 0  # outcomes whose samples are kept (under max_samples)


@dataclass(slots=True)
class VersionEvidence:
    """One version's accumulated outcomes; ``max_samples`` bounds each sample list
    (the counters keep counting past it)."""

    max_samples: int = 50_000
    requests: int = 0
    refusals: int = 0
    error_kinds: Counter = field(default_factory=Counter)
    _segments: list[_Segment] = field(default_factory=list)
    _kept: int = 0

    @property
    def errors(self) -> int:
        return sum(self.error_kinds.values())

    def add(self, now: float, outcomes: Iterable[Outcome]) -> None:
        seg = _Segment(now, 0, Counter(), 0, {k: [] for k in SAMPLES})
        for o in outcomes:
            seg.requests += 1
            if o.error is not None:
                seg.errors[o.error] += 1
            seg.refusals += o.refused
            if self._kept + seg.kept < self.max_samples:
                seg.kept += 1
                for k in SAMPLES:
                    v = getattr(o, k)
                    if v is not None:
                        seg.samples[k].append(float(v))
        self._push(seg)

    def add_counts(self, now: float, requests: int, errors: dict[str, int] | None = None,
                   refusals: int = 0, **samples: Iterable[float]) -> None:
        """A batch given as counts and sample lists (the simulator's shape)."""
        unknown = set(samples) - set(SAMPLES)
        if unknown:
            raise ValueError(f"unknown samples {sorted(unknown)}")
        room = max(0, self.max_samples - self._kept)
        kept = {k: list(samples.get(k, ()))[:room] for k in SAMPLES}
        self._push(_Segment(now, requests, Counter(errors or {}), refusals, kept, min(room, requests)))

    def _push(self, seg: _Segment) -> None:
        if seg.requests == 0:
            return
        self._segments.append(seg)
        self.requests += seg.requests
        self.error_kinds.update(seg.errors)
        self.refusals += seg.refusals
        self._kept += seg.kept

    def samples(self, name: str) -> list[float]:
        return [x for s in self._segments for x in s.samples[name]]

    def drop_since(self, t: float) -> int:
        """Take back the outcomes recorded at ``t`` or later; returns how many."""
        dropped = 0
        while self._segments and self._segments[-1].t >= t:
            seg = self._segments.pop()
            dropped += seg.requests
            self.requests -= seg.requests
            self.error_kinds.subtract(seg.errors)
            self.refusals -= seg.refusals
            self._kept -= seg.kept
        self.error_kinds = +self.error_kinds  # forget kinds now at zero
        return dropped
