"""Automated canary analysis, in the manner of Flagger and Kayenta: a pure state machine
whose every verdict is a statistical decision.

A rollout starts the canary at ``start_weight``. From then on every outcome of both
versions accumulates as the current step's evidence (``canary_evidence.py``: all of
it since the step began, never a rolling window). Every ``interval_s`` the analysis
*looks*: each signal (error rate, refusal rate, TTFT, TPOT per token, end to end,
output length) is a sequential test at ``confidence`` (``canary_stats.py``):

- a signal that **passes** (the canary is shown to be within its margin) is settled
  for the step; when every signal is settled the weight rises by ``step_weight``, or
  the canary is promoted after the step at ``max_weight``; the next step collects
  anew;
- a signal that **fails** (the canary is shown worse than the margin) counts a
  failed check; after ``failure_threshold`` of them (over the whole rollout, as
  Flagger counts) the canary rolls back to 0 %; otherwise the weight holds and the
  step collects afresh, so each failed check is an independent test;
- otherwise the look is **inconclusive**: nothing changes and nothing is reset; a
  slow trickle of traffic gives a slow but correct verdict.

``min_requests`` is a floor under every verdict, never the reason for one. An
interval the canary pool could not serve (cold, or queued for capacity) is
``not_judged``: its outcomes are taken back out and the look is a SKIP.

Data in, verdict out: outcomes go in through :meth:`CanaryAnalysis.record` (or
straight into ``evidence`` in batches, as the simulator does), time is passed in
(``now``), and :meth:`CanaryAnalysis.tick` returns the decision. What a configuration
guarantees is measured by ``llmserve simulate --canary-power`` (``sim/canary_power.py``).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.gateway.canary_evidence import Outcome, VersionEvidence
from llmserve.gateway.canary_stats import Finding, Verdict, proportion_test, rank_test


class CanaryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    start_weight: float = Field(0.05, gt=0.0, le=1.0)
    step_weight: float = Field(0.05, gt=0.0, le=1.0)
    max_weight: float = Field(0.5, gt=0.0, le=1.0)
    interval_s: float = Field(60.0, gt=0.0)  # time between looks at the evidence
    failure_threshold: int = Field(3, ge=1)
    min_requests: int = Field(20, ge=1)  # per version per step: a floor under any verdict
    # One-sided confidence of every test's bounds (each look, each signal).
    confidence: float = Field(0.99, gt=0.5, lt=1.0)
    max_error_rate_delta: float | None = Field(0.01, ge=0.0)  # canary - stable
    # Fails only: the canary's error rate shown over ratio x stable's (when stable errs).
    max_error_rate_ratio: float | None = Field(2.0, ge=1.0)
    # 4xx answers to requests the gateway sent on: refusals the stable version does not give.
    max_refusal_rate_delta: float | None = Field(0.01, ge=0.0)
    max_ttft_ratio: float | None = Field(1.5, ge=1.0)
    max_tpot_ratio: float | None = Field(1.5, ge=1.0)  # seconds per output token after the first
    max_e2e_ratio: float | None = Field(1.5, ge=1.0)
    # Absolute slack on latency comparisons, so that noise on millisecond latencies
    # does not fail a check: the margin is ratio * stable + slack.
    latency_slack_s: float = Field(0.01, ge=0.0)
    # Output length collapse: the canary's answers shown shorter than this share of stable's.
    min_output_ratio: float | None = Field(0.6, gt=0.0, le=1.0)
    history_size: int = Field(1000, ge=1)

    @model_validator(mode="after")
    def _check(self) -> CanaryConfig:
        if self.start_weight > self.max_weight:
            raise ValueError("start_weight must not exceed max_weight")
        return self

    def steps(self) -> list[float]:
        """The weights a full rollout passes through, start to max."""
        out, w = [], self.start_weight
        while w < self.max_weight - 1e-9:
            out.append(round(w, 6))
            w += self.step_weight
        out.append(self.max_weight)
        return out


class CanaryState(enum.Enum):
    IDLE = "idle"  # no rollout yet; canary gets nothing
    PROGRESSING = "progressing"
    PAUSED = "paused"  # weight frozen, checks not run
    PROMOTED = "promoted"  # canary serves all traffic
    ROLLED_BACK = "rolled_back"  # canary gets nothing


# The allowed transitions, in one place. start() may retry a rolled-back canary; a promoted
# one is the stable from then on (as in Flagger and Argo Rollouts): promoted is final, and a
# new rollout needs a new canary version.
TRANSITIONS: dict[CanaryState, frozenset[CanaryState]] = {
    CanaryState.IDLE: frozenset({CanaryState.PROGRESSING}),
    CanaryState.PROGRESSING: frozenset({CanaryState.PAUSED, CanaryState.PROMOTED,
                                        CanaryState.ROLLED_BACK}),
    CanaryState.PAUSED: frozenset({CanaryState.PROGRESSING, CanaryState.PROMOTED,
                                   CanaryState.ROLLED_BACK}),
    CanaryState.PROMOTED: frozenset(),
    CanaryState.ROLLED_BACK: frozenset({CanaryState.PROGRESSING}),
}


class InvalidTransition(RuntimeError):
    pass


class Action(enum.Enum):
    NONE = "none"  # not time for a check, or not progressing
    SKIP = "skip"  # not judged: the canary pool was short of capacity
    INCONCLUSIVE = "inconclusive"  # a look that decided nothing: keep collecting
    ADVANCE = "advance"
    HOLD = "hold"  # check failed, weight unchanged
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    START = "start"
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class Judgement:
    """One look: the step's verdict and each signal's finding (settled ones included)."""

    verdict: Verdict
    findings: tuple[Finding, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(f"{f.verdict.value}: {f.detail}" for f in self.findings)


@dataclass(frozen=True, slots=True)
class CanaryDecision:
    action: Action
    weight: float  # the canary's share of traffic from now on
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CanaryEvent:
    timestamp: float
    action: Action
    state: CanaryState
    weight: float
    reason: str


def evaluate(cfg: CanaryConfig, canary: VersionEvidence, stable: VersionEvidence,
             settled: dict[str, Finding] | None = None) -> Judgement:
    """Test every signal not yet ``settled`` (passed earlier in this step) on the
    step's evidence. FAIL if any fails, PASS if all have passed, else INCONCLUSIVE."""
    settled = settled or {}
    floor, conf = cfg.min_requests, cfg.confidence
    found: list[Finding] = []

    def want(signal: str, limit: float | None) -> bool:
        if limit is None:
            return False
        if signal in settled:
            found.append(settled[signal])
            return False
        return True

    kc, nc, ks, ns = canary.errors, canary.requests, stable.errors, stable.requests
    if want("error rate", cfg.max_error_rate_delta):
        f = proportion_test("error rate", kc, nc, ks, ns, margin=cfg.max_error_rate_delta,
                            confidence=conf, floor=floor)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(canary.error_kinds.items()))
        found.append(Finding(f.signal, f.verdict, f.detail + (f" (canary: {kinds})" if kinds else "")))
    if cfg.max_error_rate_ratio is not None and ks > 0:
        f = proportion_test("error rate ratio", kc, nc, ks, ns, margin=0.0, confidence=conf,
                            floor=floor, ratio=cfg.max_error_rate_ratio)
        if f.verdict is Verdict.FAIL:  # a guard: it can fail a step, never hold one up
            found.append(f)
    if want("refusal rate", cfg.max_refusal_rate_delta):
        found.append(proportion_test("refusal rate", canary.refusals, nc, stable.refusals, ns,
                                     margin=cfg.max_refusal_rate_delta, confidence=conf,
                                     floor=floor))
    for signal, sample, limit in (("TTFT", "ttft_s", cfg.max_ttft_ratio),
                                  ("TPOT", "tpot_s", cfg.max_tpot_ratio),
                                  ("e2e", "e2e_s", cfg.max_e2e_ratio),
                                  ("output tokens", "output_tokens", cfg.min_output_ratio)):
        if not want(signal, limit):
            continue
        c, s = canary.samples(sample), stable.samples(sample)
        if not c and not s and nc >= floor and ns >= floor:
            continue  # a signal neither version reports (no streams, no token counts)
        tokens = sample == "output_tokens"
        found.append(rank_test(signal, c, s, ratio=limit, slack=0.0 if tokens else cfg.latency_slack_s,
                               confidence=conf, floor=floor, higher_is_worse=not tokens,
                               unit="tokens" if tokens else "ms"))
    verdicts = [f.verdict.value for f in found]
    verdict = (Verdict.FAIL if "fail" in verdicts else
               Verdict.INCONCLUSIVE if "inconclusive" in verdicts or not found else Verdict.PASS)
    return Judgement(verdict, tuple(found))


@dataclass
class CanaryAnalysis:
    """The rollout of one canary version against one stable version."""

    canary: str
    stable: str
    config: CanaryConfig = field(default_factory=CanaryConfig)
    state: CanaryState = CanaryState.IDLE
    weight: float = 0.0
    failed_checks: int = 0
    last_check: float | None = None
    last_result: Judgement | None = None
    history: deque[CanaryEvent] = field(default_factory=deque)
    evidence: dict[str, VersionEvidence] = field(default_factory=dict)
    settled: dict[str, Finding] = field(default_factory=dict)  # signals passed at this step
    step_started: float | None = None

    def __post_init__(self) -> None:
        self.history = deque(self.history, maxlen=self.config.history_size)
        self._new_step(None)

    # ---- data in --------------------------------------------------------------------
    def record(self, version: str, now: float, outcome: Outcome) -> None:
        """One outcome of ``version``; kept only while the rollout is progressing."""
        ev = self.evidence.get(version)
        if ev is not None and self.state is CanaryState.PROGRESSING:
            ev.add(now, (outcome,))

    # ---- automatic ------------------------------------------------------------------
    def tick(self, now: float, not_judged: str | None = None) -> CanaryDecision:
        """Look at the evidence if a look is due; return what changed.

        ``not_judged``: why this interval says nothing about the canary (its pool had
        no ready instance or queued for capacity: a cold start is not the canary's
        fault); its outcomes are taken back out and the look is a SKIP."""
        if not self.look_due(now):
            return CanaryDecision(Action.NONE, self.weight)
        since, self.last_check = self.last_check, now
        if not_judged is not None:
            dropped = sum(ev.drop_since(since if since is not None else now)
                          for ev in self.evidence.values())
            return self._record(now, Action.SKIP, f"{not_judged}; {dropped} outcomes set aside")
        result = evaluate(self.config, self.evidence[self.canary], self.evidence[self.stable],
                          self.settled)
        self.last_result = result
        reason = "; ".join(result.reasons)
        if result.verdict is Verdict.FAIL:
            self.failed_checks += 1
            reason = f"check failed ({self.failed_checks}/{self.config.failure_threshold}): " + \
                "; ".join(f.detail for f in result.findings if f.verdict is Verdict.FAIL)
            if self.failed_checks >= self.config.failure_threshold:
                return self._settle(now, CanaryState.ROLLED_BACK, 0.0, Action.ROLLBACK, reason)
            self._new_step(now)  # the next check is a fresh, independent test
            return self._record(now, Action.HOLD, reason)
        for f in result.findings:
            if f.verdict is Verdict.PASS:
                self.settled.setdefault(f.signal, f)
        if result.verdict is Verdict.INCONCLUSIVE:
            return self._record(now, Action.INCONCLUSIVE, reason)
        if self.weight >= self.config.max_weight - 1e-9:
            return self._settle(now, CanaryState.PROMOTED, 1.0, Action.PROMOTE,
                                f"passed the last step at {self.weight:.0%}: {reason}")
        self.weight = min(self.config.max_weight, round(self.weight + self.config.step_weight, 6))
        self._new_step(now)
        return self._record(now, Action.ADVANCE, reason)

    def look_due(self, now: float) -> bool:
        """Whether :meth:`tick` at ``now`` would look (and so change the rollout)."""
        return self.state is CanaryState.PROGRESSING and (
            self.last_check is None or now - self.last_check >= self.config.interval_s)

    # ---- manual ---------------------------------------------------------------------
    def start(self, now: float, reason: str = "rollout started") -> CanaryDecision:
        if self.state in (CanaryState.PROGRESSING, CanaryState.PAUSED):
            raise InvalidTransition(f"a rollout is already {self.state.value}")
        if self.state is CanaryState.PROMOTED:  # restarting would send traffic back to the retired stable
            raise InvalidTransition(f"{self.canary!r} was promoted and is the stable now: a new rollout needs a "
                                    f"new canary version (the model's canary: version and stable)")
        self._move(CanaryState.PROGRESSING)
        self.weight = self.config.start_weight
        self.failed_checks = 0
        self._new_step(now)
        self.last_check = now  # first check after one full interval of canary traffic
        self.last_result = None
        return self._record(now, Action.START, reason)

    def promote(self, now: float, reason: str = "manual promote") -> CanaryDecision:
        return self._settle(now, CanaryState.PROMOTED, 1.0, Action.PROMOTE, reason)

    def rollback(self, now: float, reason: str = "manual rollback") -> CanaryDecision:
        return self._settle(now, CanaryState.ROLLED_BACK, 0.0, Action.ROLLBACK, reason)

    def pause(self, now: float, reason: str = "manual pause") -> CanaryDecision:
        self._move(CanaryState.PAUSED)
        return self._record(now, Action.PAUSE, reason)

    def resume(self, now: float, reason: str = "manual resume") -> CanaryDecision:
        if self.state is not CanaryState.PAUSED:
            raise InvalidTransition(f"cannot resume: the rollout is {self.state.value}")
        self._move(CanaryState.PROGRESSING)
        self.last_check = now  # a fresh interval of data before the next verdict
        return self._record(now, Action.RESUME, reason)

    # ---- reporting ------------------------------------------------------------------
    def status(self) -> dict:
        return {
            "canary": self.canary,
            "stable": self.stable,
            "state": self.state.value,
            "weight": self.weight,
            "failed_checks": self.failed_checks,
            "failure_threshold": self.config.failure_threshold,
            "confidence": self.config.confidence,
            "last_check": self.last_check,
            "step_started": self.step_started,
            "evidence": {v: {"requests": ev.requests, "errors": dict(ev.error_kinds),
                             "refusals": ev.refusals} for v, ev in self.evidence.items()},
            "settled": sorted(self.settled),
            "last_result": None if self.last_result is None else {
                "verdict": self.last_result.verdict.value,
                "reasons": list(self.last_result.reasons),
            },
            "steps": self.config.steps(),
        }

    def events(self) -> list[dict]:
        return [{"timestamp": e.timestamp, "action": e.action.value, "state": e.state.value,
                 "weight": e.weight, "reason": e.reason} for e in self.history]

    # ---- internals ------------------------------------------------------------------
    def _new_step(self, now: float | None) -> None:
        self.evidence = {v: VersionEvidence() for v in (self.canary, self.stable)}
        self.settled = {}
        self.step_started = now

    def _move(self, to: CanaryState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise InvalidTransition(f"cannot go from {self.state.value} to {to.value}")
        self.state = to

    def _settle(self, now: float, to: CanaryState, weight: float, action: Action,
                reason: str) -> CanaryDecision:
        self._move(to)
        self.weight = weight
        return self._record(now, action, reason)

    def _record(self, now: float, action: Action, reason: str) -> CanaryDecision:
        self.history.append(CanaryEvent(now, action, self.state, self.weight, reason))
        return CanaryDecision(action, self.weight, reason)
