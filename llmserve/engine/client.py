"""The engine client seam: what the server (and ``/metrics``, ``/load``) holds of an engine.

Two implementations, vLLM v1's shape: :class:`~llmserve.engine.in_thread.InThreadEngine`
runs the core on a thread of this process, :class:`~llmserve.engine.multi_process.MultiProcessEngine`
talks to a core in a child process. Both check and tokenise a request with one
:class:`~llmserve.engine.input_processor.InputProcessor` before it leaves the caller,
and both hand each request's outputs out through :class:`RequestStreams`.

Two ways a stream ends in error. A request that failed alone (the core's output
has ``error`` set) raises :class:`RequestFailedError` in its own stream; the others
go on. A fault of the whole batch or of the engine loop kills the engine: every
stream raises :class:`EngineDeadError`, new requests are refused, and
``is_alive()`` is False with the reason in ``death``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from llmserve.engine.outputs import RequestOutput
from llmserve.engine.sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
    """The engine loop is not running: the batch's forward pass failed or the loop crashed."""


class RequestFailedError(RuntimeError):
    """This request alone failed; ``output`` is its last output (what it generated so far)."""

    def __init__(self, output: RequestOutput) -> None:
        super().__init__(output.error or "the request failed")
        self.output = output


@runtime_checkable
class EngineClient(Protocol):
    """One engine as its callers see it, wherever its core runs."""

    tokenizer: Any
    death: str | None  # why the engine died; None while it runs
    last_heartbeat: float  # (monotonic) when its loop last showed life

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def model_name(self) -> str: ...

    @property
    def sampling_defaults(self) -> dict[str, Any]: ...  # the model's generation_config.json recommends

    def is_alive(self) -> bool: ...

    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                    *, priority: int | str | None = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None, resume_token_ids: list[int] | None = None,
                    trace: str | None = None) -> AsyncIterator[RequestOutput]:
        """Check now (``ValueError`` at once), then the request's output stream: incremental
        outputs until the final one; closing it early aborts the request."""
        ...

    def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                 **kw: Any) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...

    def compile_grammar(self, params: SamplingParams) -> Any:
        """Check (and compile) a structured output's grammar; safe from a worker thread."""
        ...

    def warm_grammar(self) -> Any: ...

    def set_threads(self, n: int) -> None: ...

    def load_snapshot(self) -> dict[str, Any]: ...

    def snapshot(self) -> dict[str, Any]:
        """What ``/metrics`` reads, the same shape from both clients."""
        ...

    def add_stats_listener(self, listener: Any) -> None: ...

    def shutdown(self) -> None: ...


EngineStart = Callable[[], Awaitable[EngineClient]]  # builds (or connects to) an engine, once


async def request_stream(q: asyncio.Queue, on_close: Callable[[bool], None]) -> AsyncIterator[RequestOutput]:
    """One request's outputs from its queue: an exception put there is raised, a failed
    output raises RequestFailedError, the final output ends it; ``on_close(finished)``
    runs however the consumer leaves."""
    finished = False
    try:
        while True:
            item = await q.get()
            if isinstance(item, BaseException):
                finished = True
                raise item
            if item.error is not None:
                finished = True
                raise RequestFailedError(item)
            yield item
            if item.finished:
                finished = True
                return
    finally:
        on_close(finished)


class RequestStreams:
    """What both clients do with a request's stream once added: hand it out, and on
    close forget it (aborting it if it had not finished). The client provides
    ``_streams`` (by request id), ``add_request`` and ``abort``."""

    _streams: dict

    def _stream(self, rid: str, q: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        return request_stream(q, lambda finished: self._close_stream(rid, finished))

    def _close_stream(self, rid: str, finished: bool) -> None:
        self._streams.pop(rid, None)
        if not finished:
            self.abort(rid)  # type: ignore[attr-defined]

    async def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                       **kw: Any) -> AsyncIterator[RequestOutput]:
        """``add_request`` and iterate, as one async generator."""
        async for out in self.add_request(prompt, params, request_id, **kw):  # type: ignore[attr-defined]
            yield out
