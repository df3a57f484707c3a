"""Every replica's canary outcomes in every replica's evidence.

Each replica proxies a share of the traffic, but a look must judge all of it: a
verdict on 1/N of the outcomes would take N times as long, and the replica that
looks may be any of them. So each replica tees the outcomes its requests give its
canary analysis: they are recorded locally at once and appended, as one JSON
batch every ``interval_s``, to one Redis stream (capped). Every replica reads the
stream from where it left off and records the other replicas' outcomes into its
own evidence, so every replica judges (nearly) the same evidence.

An outcome from before the current step began is not recorded (it belongs to a
step already judged). A remote outcome is stamped with the time it arrived here, so
an interval set aside as not judged (a cold canary pool) takes back what arrived in
it. Each batch is validated before any of it is recorded; while the store is away
the replica's own outcomes stay local and the others' wait in the stream.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any

from pydantic import TypeAdapter, ValidationError

from llmserve.gateway.canary import CanaryAnalysis
from llmserve.gateway.canary_evidence import Outcome, OutcomeSink
from llmserve.state.store import OUTAGE

log = logging.getLogger(__name__)

MAX_BATCHES = 10_000  # stream entries kept (about 80 minutes of batches from 2 replicas)

_BATCH = TypeAdapter(list[tuple[str, str, float, dict[str, Any]]])
_OUTCOME = TypeAdapter(Outcome)
FIELDS = frozenset(Outcome.__dataclass_fields__)


def _outcomes(raw: str) -> list[tuple[str, str, float, Outcome]]:
    """A batch as read from the stream; ValueError unless every item is an outcome with
    its fields and no others."""
    out = []
    for model, version, t, fields in _BATCH.validate_python(json.loads(raw)):
        if not fields.keys() <= FIELDS:
            raise ValueError(f"unknown outcome fields {sorted(fields.keys() - FIELDS)}")
        out.append((model, version, t, _OUTCOME.validate_python(fields)))
    return out


class _Tee:
    """The analysis's sink, with every outcome also kept for the other replicas."""

    def __init__(self, share: OutcomeShare, model: str, analysis: OutcomeSink) -> None:
        self.share, self.model, self.analysis = share, model, analysis

    def record(self, version: str, now: float, outcome: Outcome) -> None:
        self.analysis.record(version, now, outcome)
        self.share.buffer.append((self.model, version, now, outcome))


class OutcomeShare:
    def __init__(self, client: Any, analyses: dict[str, CanaryAnalysis],
                 key: str = "llmserve:outcomes") -> None:
        self._r, self.key, self.analyses = client, key, analyses
        self.replica_id = secrets.token_hex(6)  # this process, in the stream
        self.buffer: list[tuple[str, str, float, Outcome]] = []
        self._last_id = "0-0"  # from the start: a replica joining mid-step gets the step's outcomes
        self.received = 0

    def sink(self, model: str) -> OutcomeSink:
        return _Tee(self, model, self.analyses[model])

    async def step(self) -> None:
        await self._push()
        await self._pull()

    async def _push(self) -> None:
        if not self.buffer:
            return
        batch, self.buffer = self.buffer, []
        raw = json.dumps([[m, v, t, {f: getattr(o, f) for f in FIELDS}]
                          for m, v, t, o in batch])
        try:
            await self._r.xadd(self.key, {"r": self.replica_id, "b": raw}, maxlen=MAX_BATCHES, approximate=True)
        except OUTAGE:
            pass  # recorded here already; the others judge without them

    async def _pull(self) -> None:
        try:
            got = await self._r.xread({self.key: self._last_id}, count=500)
        except OUTAGE:
            return  # they wait in the stream
        for _, entries in got:
            for entry_id, fields in entries:
                self._last_id = entry_id
                if fields.get("r") != self.replica_id:
                    self._record(fields.get("b", ""))

    def _record(self, raw: str) -> None:
        try:
            batch = _outcomes(raw)
        except (ValueError, ValidationError) as e:
            log.warning("dropping a malformed outcome batch: %s", str(e).splitlines()[0])
            return
        now = time.time()
        for model, version, t, outcome in batch:
            a = self.analyses.get(model)
            if a is None or (a.step_started is not None and t < a.step_started):
                continue
            a.record(version, now, outcome)
            self.received += 1
