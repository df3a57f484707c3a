"""Automated canary analysis, in the manner of Flagger: a pure state machine.

A rollout starts the canary at ``start_weight``. Every ``interval_s`` one check
compares the canary with the stable version over the last window: error rate
(absolute delta and ratio) and TTFT / end-to-end p99 (ratio). A passed check
raises the weight by ``step_weight`` up to ``max_weight``; a passed check at
``max_weight`` promotes. A failed check holds the weight and counts; after
``failure_threshold`` failed checks (over the whole rollout, as Flagger counts)
the canary rolls back to 0%. With too little traffic for a verdict the check is
skipped: the weight holds and nothing counts.

Time is passed in (``now``), so tests and the simulator drive it with any clock.
Stats come from :class:`llmserve.gateway.window_stats.WindowStats`.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.gateway.window_stats import VersionStats, WindowStats  # noqa: F401 (re-export)


class CanaryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    start_weight: float = Field(0.05, gt=0.0, le=1.0)
    step_weight: float = Field(0.05, gt=0.0, le=1.0)
    max_weight: float = Field(0.5, gt=0.0, le=1.0)
    interval_s: float = Field(60.0, gt=0.0)
    failure_threshold: int = Field(3, ge=1)
    min_requests: int = Field(20, ge=1)  # per version per check, else the check is skipped
    max_error_rate_delta: float | None = Field(0.01, ge=0.0)  # canary - stable
    max_error_rate_ratio: float | None = Field(2.0, ge=1.0)  # canary / stable, when stable > 0
    max_ttft_p99_ratio: float | None = Field(1.5, ge=1.0)
    max_e2e_p99_ratio: float | None = Field(1.5, ge=1.0)
    # Absolute slack on latency comparisons, so that noise on millisecond latencies
    # does not fail a check: fail only if canary > ratio * stable + slack.
    latency_slack_s: float = Field(0.01, ge=0.0)
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


# The allowed transitions, in one place. start() may restart from any settled state.
TRANSITIONS: dict[CanaryState, frozenset[CanaryState]] = {
    CanaryState.IDLE: frozenset({CanaryState.PROGRESSING}),
    CanaryState.PROGRESSING: frozenset({CanaryState.PAUSED, CanaryState.PROMOTED,
                                        CanaryState.ROLLED_BACK}),
    CanaryState.PAUSED: frozenset({CanaryState.PROGRESSING, CanaryState.PROMOTED,
                                   CanaryState.ROLLED_BACK}),
    CanaryState.PROMOTED: frozenset({CanaryState.PROGRESSING}),
    CanaryState.ROLLED_BACK: frozenset({CanaryState.PROGRESSING}),
}


class InvalidTransition(RuntimeError):
    pass


class Action(enum.Enum):
    NONE = "none"  # not time for a check, or not progressing
    SKIP = "skip"  # check skipped: too little traffic, or the canary pool short of capacity
    ADVANCE = "advance"
    HOLD = "hold"  # check failed, weight unchanged
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    START = "start"
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class CheckResult:
    passed: bool
    skipped: bool
    reasons: tuple[str, ...]


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


def evaluate(cfg: CanaryConfig, canary: VersionStats, stable: VersionStats) -> CheckResult:
    """Compare the canary with the stable version over one window."""
    if canary.requests < cfg.min_requests or stable.requests < cfg.min_requests:
        return CheckResult(False, True, (
            f"not enough traffic: canary {canary.requests}, stable {stable.requests} "
            f"requests (need {cfg.min_requests} each)",))
    failures: list[str] = []
    ce, se = canary.error_rate, stable.error_rate
    if cfg.max_error_rate_delta is not None and ce - se > cfg.max_error_rate_delta:
        failures.append(f"error rate {ce:.3f} exceeds stable {se:.3f} by more than "
                        f"{cfg.max_error_rate_delta}")
    if cfg.max_error_rate_ratio is not None and se > 0 and ce > cfg.max_error_rate_ratio * se:
        failures.append(f"error rate {ce:.3f} is over {cfg.max_error_rate_ratio}x "
                        f"stable {se:.3f}")
    for label, ratio, c, s in (("TTFT p99", cfg.max_ttft_p99_ratio, canary.ttft_p99,
                                stable.ttft_p99),
                               ("e2e p99", cfg.max_e2e_p99_ratio, canary.e2e_p99,
                                stable.e2e_p99)):
        if ratio is None or c is None or s is None:
            continue
        if c > ratio * s + cfg.latency_slack_s:
            failures.append(f"{label} {c * 1000:.1f} ms is over {ratio}x stable "
                            f"{s * 1000:.1f} ms")
    if failures:
        return CheckResult(False, False, tuple(failures))
    return CheckResult(True, False, ("all metrics within thresholds",))


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
    last_result: CheckResult | None = None
    history: deque[CanaryEvent] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.history = deque(self.history, maxlen=self.config.history_size)

    # ---- automatic ------------------------------------------------------------------
    def tick(self, now: float, canary_stats: VersionStats,
             stable_stats: VersionStats, not_judged: str | None = None) -> CanaryDecision:
        """Run a check if one is due; return what changed.

        ``not_judged``: why this interval says nothing about the canary (its pool had
        no ready instance or queued for capacity: a cold start is not the canary's
        fault); a due check is then a SKIP with that reason, and the next interval
        starts afresh."""
        if self.state is not CanaryState.PROGRESSING:
            return CanaryDecision(Action.NONE, self.weight)
        if self.last_check is not None and now - self.last_check < self.config.interval_s:
            return CanaryDecision(Action.NONE, self.weight)
        self.last_check = now
        if not_judged is not None:
            self.last_result = CheckResult(False, True, (not_judged,))
            return self._record(now, Action.SKIP, not_judged)
        result = evaluate(self.config, canary_stats, stable_stats)
        self.last_result = result
        reason = "; ".join(result.reasons)
        if result.skipped:
            return self._record(now, Action.SKIP, reason)
        if not result.passed:
            self.failed_checks += 1
            reason = f"check failed ({self.failed_checks}/{self.config.failure_threshold}): {reason}"
            if self.failed_checks >= self.config.failure_threshold:
                return self._settle(now, CanaryState.ROLLED_BACK, 0.0, Action.ROLLBACK, reason)
            return self._record(now, Action.HOLD, reason)
        if self.weight >= self.config.max_weight - 1e-9:
            return self._settle(now, CanaryState.PROMOTED, 1.0, Action.PROMOTE,
                                f"passed the last step at {self.weight:.0%}")
        self.weight = min(self.config.max_weight, round(self.weight + self.config.step_weight, 6))
        return self._record(now, Action.ADVANCE, reason)

    # ---- manual ---------------------------------------------------------------------
    def start(self, now: float, reason: str = "rollout started") -> CanaryDecision:
        if self.state in (CanaryState.PROGRESSING, CanaryState.PAUSED):
            raise InvalidTransition(f"a rollout is already {self.state.value}")
        self._move(CanaryState.PROGRESSING)
        self.weight = self.config.start_weight
        self.failed_checks = 0
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
            "last_check": self.last_check,
            "last_result": None if self.last_result is None else {
                "passed": self.last_result.passed,
                "skipped": self.last_result.skipped,
                "reasons": list(self.last_result.reasons),
            },
            "steps": self.config.steps(),
        }

    def events(self) -> list[dict]:
        return [{"timestamp": e.timestamp, "action": e.action.value, "state": e.state.value,
                 "weight": e.weight, "reason": e.reason} for e in self.history]

    # ---- internals ------------------------------------------------------------------
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
