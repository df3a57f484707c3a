"""Request signals forwarded from a follower replica to the controller's replica through
a real Redis: replayed into its observers with the same times, a malformed batch
dropped whole, nothing kept while the store is away."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from llmserve.state.redis_conn import connect
from llmserve.state.signals import SignalForwarder, SignalIntake


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def on_arrival(self, model, version, t, prompt_chars, batch=False):
        self.seen.append(("arrival", model, version, t, prompt_chars, batch))

    def on_first_token(self, model, version, t, ttft_s, batch=False):
        self.seen.append(("first_token", model, version, t, ttft_s, batch))

    def on_finish(self, model, version, t, e2e_s, output_tokens, ok, batch=False):
        self.seen.append(("finish", model, version, t, e2e_s, output_tokens, ok, batch))

    def on_batch_need(self, model, lines_per_s):
        self.seen.append(("batch_need", model, lines_per_s))


def test_a_followers_signals_reach_the_controllers_observers(redis_server):
    async def go():
        follower, owner = await connect(redis_server.url, timeout_s=10), await connect(redis_server.url, timeout_s=10)
        fwd = SignalForwarder(follower)
        rec = Recorder()
        intake = SignalIntake(owner, lambda: [rec, fwd])  # a forwarder is never replayed into
        t = time.monotonic()
        fwd.on_arrival("chat", "v1", t, 120)
        fwd.on_first_token("chat", "v1", t + 0.2, 0.2)
        fwd.on_finish("chat", "v1", t + 1.0, 1.0, 17, True, batch=True)
        fwd.on_batch_need("chat", 3.5)
        await fwd.step()
        await owner.rpush("llmserve:signals", json.dumps([["arrival", "chat", "v1", "soon", 1, False]]))
        await owner.rpush("llmserve:signals", json.dumps([["exec", "rm -rf /"]]))
        await intake.step()
        kinds = [e[0] for e in rec.seen]
        assert kinds == ["arrival", "first_token", "finish", "batch_need"]  # the bad batches dropped
        assert rec.seen[0][3] == pytest.approx(t, abs=0.05) and rec.seen[0][4] == 120
        assert rec.seen[2][4:] == (1.0, 17, True, True) and rec.seen[3] == ("batch_need", "chat", 3.5)
        await intake.step()
        assert len(rec.seen) == 4  # taken once
        redis_server.stop()
        fwd.on_arrival("chat", "v1", t, 1)
        await fwd.step()  # dropped, not hoarded
        assert fwd.dropped == 1
        await intake.step()  # nothing to take, no error
        await follower.aclose()
        await owner.aclose()
    asyncio.run(go())
