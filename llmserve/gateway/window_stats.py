"""Rolling per-version request outcomes over a time window, for canary checks."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from llmserve.percentiles import percentile


@dataclass(frozen=True, slots=True)
class VersionStats:
    """One version's outcomes over a window."""

    requests: int = 0
    errors: int = 0
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p99: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


class WindowStats:
    """Per version: completed requests of the last ``window_s`` seconds.

    ``ttft_s`` is None for requests that never produced a token (errors); those
    count toward the error rate but not the latency percentiles. At most
    ``max_samples`` requests per version are kept, newest first, which bounds
    memory and the cost of a snapshot at high request rates.
    """

    def __init__(self, window_s: float, max_samples: int = 20_000) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self.max_samples = max_samples
        self._samples: dict[str, deque[tuple[float, bool, float | None, float | None]]] = {}

    def record(self, version: str, now: float, ok: bool, ttft_s: float | None = None,
               e2e_s: float | None = None) -> None:
        q = self._samples.get(version)
        if q is None:
            q = self._samples[version] = deque(maxlen=self.max_samples)
        q.append((now, ok, ttft_s, e2e_s))

    def snapshot(self, version: str, now: float) -> VersionStats:
        q = self._samples.get(version)
        if not q:
            return VersionStats()
        horizon = now - self.window_s
        while q and q[0][0] < horizon:
            q.popleft()
        errors = sum(1 for _, ok, _, _ in q if not ok)
        ttft = sorted(t for _, _, t, _ in q if t is not None)
        e2e = sorted(e for _, ok, _, e in q if ok and e is not None)
        return VersionStats(
            requests=len(q), errors=errors,
            ttft_p50=percentile(ttft, 50, is_sorted=True), ttft_p99=percentile(ttft, 99, is_sorted=True),
            e2e_p50=percentile(e2e, 50, is_sorted=True), e2e_p99=percentile(e2e, 99, is_sorted=True),
        )

    def clear(self, version: str | None = None) -> None:
        if version is None:
            self._samples.clear()
        else:
            self._samples.pop(version, None)
