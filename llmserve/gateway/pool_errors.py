"""What a pool's request path raises: the proxy answers each with its status (429 or 503)."""

from __future__ import annotations

from llmserve.gateway.admission import Rejected


class QueueFull(Exception):
    def __init__(self, rejected: Rejected) -> None:
        super().__init__(rejected.reason)
        self.rejected = rejected


class QueueTimeout(Exception):
    def __init__(self, message: str, waited_s: float) -> None:
        super().__init__(message)
        self.waited_s = waited_s


class NoHealthyInstance(Exception):
    """Every instance of the pool has failed (breaker open, ejected, gone unready, draining).

    Requests fail fast instead of waiting for a deadline: capacity that is broken
    is not coming back soon. An empty pool, or one whose instances have never been
    ready yet (starting, scaling from zero), makes requests wait instead, unless
    its controller gave up starting them (``Pool.set_failed``: the message says why).
    ``retry_after_s``: when the first breaker lets a probe through (else a health check's time);
    ``code``: the error code the client reads (``pool_failed`` for a pool that gave up).
    """

    def __init__(self, message: str, retry_after_s: int, code: str = "no_healthy_instance") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.code = code
