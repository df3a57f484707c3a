"""``StreamBuffer``: a request's sequence streams merged for one reader, bounded."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.engine.outputs import CompletionOutput, RequestOutput
from llmserve.server.stream_buffer import ReaderTooSlow, StreamBuffer


def out(i: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", [], [CompletionOutput(0, "", [], delta_token_ids=[i])], finished)


async def engine_stream(n: int, stopped: asyncio.Event | None = None):
    """``n`` outputs, one per loop turn (as the engine delivers them), or fewer if stopped."""
    for i in range(n):
        await asyncio.sleep(0)
        if stopped is not None and stopped.is_set():
            yield out(i, finished=True)  # the engine's abort output
            return
        yield out(i, finished=i == n - 1)


async def test_merges_every_stream_in_arrival_order_and_ends():
    buf = StreamBuffer([(0, engine_stream(3)), (1, engine_stream(2))], capacity=100, on_overflow=lambda: None)
    got = []
    while (item := await buf.get()) is not None:
        got.append((item[0], item[1].outputs[0].delta_token_ids[0]))
    assert sorted(got) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert [i for s, i in got if s == 0] == [0, 1, 2]


async def test_errors_are_handed_to_the_reader_in_band():
    async def broken():
        yield out(0)
        raise RuntimeError("engine step failed")

    buf = StreamBuffer([(0, broken())], capacity=10, on_overflow=lambda: None)
    assert (await buf.get())[1].outputs[0].delta_token_ids == [0]
    idx, err = await buf.get()
    assert isinstance(err, RuntimeError) and await buf.get() is None


async def test_a_reader_that_falls_behind_overflows_once_and_the_streams_drain():
    stopped = asyncio.Event()
    calls = []
    seen = []

    def on_overflow():
        calls.append(1)
        stopped.set()  # what serving does: abort the request

    streams = [(i, engine_stream(1000, stopped)) for i in range(2)]
    buf = StreamBuffer(streams, capacity=8, on_overflow=on_overflow)
    for _ in range(200):  # the reader is stuck: the buffer never holds more than its capacity
        seen.append(len(buf))
        await asyncio.sleep(0)
    assert max(seen) <= 8 and calls == [1] and len(buf) == 0
    with pytest.raises(ReaderTooSlow):
        await buf.get()
    assert all(t.done() for t in buf._tasks)  # both streams ran to their (abort) end
    buf.close()
