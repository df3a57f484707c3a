"""The outputs of one streamed request's sequences, merged and bounded for its reader.

The engine does not wait for a slow client: it produces a step's outputs whether or
not the last ones were sent. When a client stops reading, the transport's buffer
fills, the SSE generator blocks in ``send``, and the outputs pile up here. Rather
than hold them without end (and keep generating for nobody), the buffer takes at
most ``capacity`` outputs; one more, and it calls ``on_overflow`` (the caller
aborts the request), drops what it holds, and its reader gets ``ReaderTooSlow``.
After an overflow the sequence streams are still drained, so the engine's abort
outputs are consumed and its per-request queues end.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

from llmserve.engine.outputs import RequestOutput

Item = tuple[int, RequestOutput | Exception]


class ReaderTooSlow(Exception):
    """More outputs were waiting for the reader than the buffer holds."""


class StreamBuffer:
    def __init__(self, streams: list[tuple[int, AsyncIterator[RequestOutput]]], capacity: int,
                 on_overflow: Callable[[], None]) -> None:
        """``streams``: (choice index, the sequence's output stream) pairs."""
        self.capacity = capacity
        self.on_overflow = on_overflow
        self.overflowed = False
        self._items: deque[Item] = deque()
        self._open = len(streams)
        self._waiter: asyncio.Future | None = None
        self._tasks = [asyncio.create_task(self._pump(idx, s)) for idx, s in streams]

    def __len__(self) -> int:
        return len(self._items)

    async def get(self) -> Item | None:
        """The next (index, output or error); None once every stream has ended."""
        while True:
            if self.overflowed:
                raise ReaderTooSlow(f"over {self.capacity} outputs were waiting for the client")
            if self._items:
                return self._items.popleft()
            if not self._open:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()

    async def _pump(self, idx: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                self._push((idx, out))
        except Exception as e:  # noqa: BLE001 - reported in-band by the reader
            self._push((idx, e))
        finally:
            self._open -= 1
            self._wake()

    def _push(self, item: Item) -> None:
        if self.overflowed:
            return
        if len(self._items) >= self.capacity:
            self.overflowed = True
            self._items.clear()
            self.on_overflow()
        else:
            self._items.append(item)
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
