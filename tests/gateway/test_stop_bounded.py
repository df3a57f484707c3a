"""The gateway's shutdown steps are bounded: one that hangs, even through its cancel,
or one that fails, is logged and the remaining steps still run."""

from __future__ import annotations

import asyncio
import logging

from llmserve.gateway import runtime


async def _stubborn(release: asyncio.Event) -> None:
    for _ in range(100):  # a fuse: a broken _bounded that waits for it fails the test, not hangs it
        if release.is_set():
            return
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            continue  # ignores its cancel, as a stuck client call might


async def _failing() -> None:
    raise RuntimeError("store said no")


async def _last(ran: list[str]) -> None:
    await asyncio.sleep(0)
    ran.append("last")


def test_a_stuck_or_failing_step_does_not_stop_the_rest(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "STOP_STEP_S", 0.2)
    ran: list[str] = []

    async def steps() -> bool:
        release = asyncio.Event()
        await runtime._bounded(_stubborn(release), "stubborn")
        await runtime._bounded(_failing(), "failing")
        await runtime._bounded(_last(ran), "last")
        stubborn = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_stubborn"]
        left_behind = len(stubborn) == 1 and not stubborn[0].done()  # the rest ran while it still spun
        release.set()
        await asyncio.sleep(0.05)
        return left_behind

    with caplog.at_level(logging.WARNING, logger=runtime.log.name):
        left_behind = asyncio.run(steps())
    assert ran == ["last"] and left_behind
    text = caplog.text
    assert "stopping stubborn took over" in text and "stopping failing failed" in text
    assert "store said no" in text
