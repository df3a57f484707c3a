"""Canary outcomes shared through a real Redis stream: what one replica's requests show
lands in the other's evidence (once, not echoed back), outcomes of a step already
judged are left out, a malformed batch is dropped whole."""

from __future__ import annotations

import asyncio
import json

from llmserve.gateway.canary import CanaryAnalysis, CanaryConfig
from llmserve.gateway.canary_evidence import Outcome
from llmserve.state.outcomes import OutcomeShare
from llmserve.state.redis_conn import connect


def _analysis(now: float) -> CanaryAnalysis:
    a = CanaryAnalysis("canary", "v1", CanaryConfig())
    a.start(now)
    return a


def test_one_replicas_outcomes_land_in_the_others_evidence(redis_server):
    async def go():
        ra, rb = await connect(redis_server.url, timeout_s=10), await connect(redis_server.url, timeout_s=10)
        a, b = _analysis(100.0), _analysis(100.0)
        sa, sb = OutcomeShare(ra, {"chat": a}), OutcomeShare(rb, {"chat": b})
        tee = sa.sink("chat")
        tee.record("canary", 100.5, Outcome(error="upstream_5xx"))
        tee.record("v1", 100.6, Outcome(ttft_s=0.05, e2e_s=0.2, output_tokens=9))
        tee.record("v1", 99.0, Outcome())  # before the step began: judged already
        await sa.step()
        await rb.xadd("llmserve:outcomes", {"r": "intruder", "b": json.dumps([["chat", "v1", 1e12, {"exec": 1}]])})
        await sb.step()
        assert (b.evidence["canary"].requests, b.evidence["canary"].errors) == (1, 1)
        assert b.evidence["v1"].requests == 1 and b.evidence["v1"].samples("output_tokens") == [9]
        assert a.evidence["v1"].requests == 2  # A recorded its own at once
        await sa.step()  # A reads its own batch back from the stream: not recorded twice
        assert a.evidence["v1"].requests == 2 and a.evidence["canary"].requests == 1
        await sb.step()
        assert b.evidence["v1"].requests == 1  # read once
        c = _analysis(100.0)  # a replica joining mid-step gets the step's outcomes so far
        await OutcomeShare(rb, {"chat": c}).step()
        assert c.evidence["canary"].requests == 1 and c.evidence["v1"].requests == 1
        await ra.aclose()
        await rb.aclose()
    asyncio.run(go())

