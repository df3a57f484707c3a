"""Request events for whoever watches the gateway's traffic (the autoscaler's signal
collector): a small observer protocol, called on the event loop, never blocking.
And the service protocol for components that live and die with the gateway.

Times are ``time.monotonic()`` seconds. ``output_tokens`` is the completion's
``usage.completion_tokens`` when the upstream reports it, else the number of
streamed content events (one token each with llmserve engines), else 0.
``batch`` says the request is of the batch priority class (its latency is not the
SLO's, and it is demand only as far as a completion window needs it). A batch
runner tells ``on_batch_need`` the lines per second its completion windows for
``model`` require (0 once none is active).
"""

from __future__ import annotations

from typing import Protocol


class RequestObserver(Protocol):
    def on_arrival(self, model: str, version: str, t: float, prompt_chars: int, batch: bool = False) -> None: ...

    def on_first_token(self, model: str, version: str, t: float, ttft_s: float, batch: bool = False) -> None: ...

    def on_finish(self, model: str, version: str, t: float, e2e_s: float, output_tokens: int,
                  ok: bool, batch: bool = False) -> None: ...

    def on_batch_need(self, model: str, lines_per_s: float) -> None: ...


class GatewayService(Protocol):
    """Something started with the gateway and stopped before it (the elastic controller)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
