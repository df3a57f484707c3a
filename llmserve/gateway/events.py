"""Request events for whoever watches the gateway's traffic (the autoscaler's signal
collector): a small observer protocol, called on the event loop, never blocking.
And the service protocol for components that live and die with the gateway.

Times are ``time.monotonic()`` seconds. ``output_tokens`` is the completion's
``usage.completion_tokens`` when the upstream reports it, else the number of
streamed content events (one token each with llmserve engines), else 0.
"""

from __future__ import annotations

from typing import Protocol


class RequestObserver(Protocol):
    def on_arrival(self, model: str, version: str, t: float, prompt_chars: int) -> None: ...

    def on_first_token(self, model: str, version: str, t: float, ttft_s: float) -> None: ...

    def on_finish(self, model: str, version: str, t: float, e2e_s: float, output_tokens: int,
                  ok: bool) -> None: ...


class GatewayService(Protocol):
    """Something started with the gateway and stopped before it (the elastic controller)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
