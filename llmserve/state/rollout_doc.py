"""A canary rollout as the JSON document replicas share: the part of
:class:`~llmserve.gateway.canary.CanaryAnalysis` every replica must agree on.

Shared: state, weight, failed checks, when the step began and the last look was
taken, the signals settled at this step, the last verdict and the history. Not
shared: the evidence (the outcomes each replica saw itself), which a replica keeps
only while the step it was collected for lasts. The document is validated as it is
read (:class:`RolloutDoc`): a malformed one is refused, never half applied.
"""

from __future__ import annotations

from collections import deque

from pydantic import BaseModel, ConfigDict

from llmserve.gateway.canary import (Action, CanaryAnalysis, CanaryEvent, CanaryState,
                                     Judgement)
from llmserve.gateway.canary_stats import Finding, Verdict


class FindingDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signal: str
    verdict: Verdict
    detail: str


class JudgementDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    verdict: Verdict
    findings: list[FindingDoc]


class EventDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timestamp: float
    action: Action
    state: CanaryState
    weight: float
    reason: str


class RolloutDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    canary: str
    stable: str
    state: CanaryState
    weight: float
    failed_checks: int
    last_check: float | None
    step_started: float | None
    settled: list[FindingDoc]
    last_result: JudgementDoc | None
    history: list[EventDoc]


def _finding(f: Finding) -> dict:
    return {"signal": f.signal, "verdict": f.verdict.value, "detail": f.detail}


def rollout_doc(a: CanaryAnalysis) -> dict:
    """The shared part of ``a`` as a JSON-ready dict."""
    last = a.last_result
    return {"canary": a.canary, "stable": a.stable, "state": a.state.value, "weight": a.weight,
            "failed_checks": a.failed_checks, "last_check": a.last_check,
            "step_started": a.step_started, "settled": [_finding(f) for f in a.settled.values()],
            "last_result": None if last is None else {
                "verdict": last.verdict.value, "findings": [_finding(f) for f in last.findings]},
            "history": [{"timestamp": e.timestamp, "action": e.action.value, "state": e.state.value,
                         "weight": e.weight, "reason": e.reason} for e in a.history]}


def adopt(a: CanaryAnalysis, raw: dict) -> None:
    """Make ``a`` what the document says. The evidence collected so far is kept only
    if the document is still at the same step of the same rollout state."""
    doc = RolloutDoc.model_validate(raw)  # raises before anything changes
    if (doc.canary, doc.stable) != (a.canary, a.stable):
        raise ValueError(f"the shared rollout is {doc.canary} against {doc.stable}, "
                         f"this gateway's is {a.canary} against {a.stable}")
    same_step = doc.step_started == a.step_started and doc.state is a.state
    if not same_step:
        a._new_step(doc.step_started)
    a.state, a.weight, a.failed_checks = doc.state, doc.weight, doc.failed_checks
    a.last_check, a.step_started = doc.last_check, doc.step_started
    a.settled = {f.signal: Finding(f.signal, f.verdict, f.detail) for f in doc.settled}
    a.last_result = None if doc.last_result is None else Judgement(
        doc.last_result.verdict, tuple(Finding(f.signal, f.verdict, f.detail)
                                       for f in doc.last_result.findings))
    a.history = deque((CanaryEvent(e.timestamp, e.action, e.state, e.weight, e.reason)
                       for e in doc.history), maxlen=a.config.history_size)
