"""What the gateway's pure decision code sees of one upstream instance."""

from __future__ import annotations

from dataclasses import dataclass

from llmserve.load_report import LoadReport


@dataclass(frozen=True, slots=True)
class InstanceView:
    """A snapshot of one instance: its last load report plus the gateway's own view.

    ``inflight`` is what this gateway has in flight to the instance now and
    ``inflight_at_report`` what it had when ``report`` was taken. The difference
    corrects the (up to a poll interval old) report for what this gateway sent or
    saw finish since, so a burst does not all land on one instance before the next
    poll, and a finished request frees room at once.
    """

    instance_id: str
    url: str = ""
    ready: bool = True  # the last active /ready check passed (health, not lifecycle)
    healthy: bool = True  # not ejected as an outlier
    accepting: bool = True  # the pool's owner lets new requests come (False: draining)
    has_been_ready: bool = True  # some /ready check passed: requests wait for one that never did
    breaker_available: bool = True  # circuit closed, or half-open with the probe free
    inflight: int = 0
    inflight_at_report: int = 0
    report: LoadReport | None = None
    # LoRA adapters resident (in a slot: the report's lora_adapters), and loaded in memory only
    # (the report's lora_adapters_loaded, and what this gateway loaded or is loading since)
    adapters: frozenset[str] = frozenset()
    adapters_loaded: frozenset[str] = frozenset()

    @property
    def routable(self) -> bool:
        """Eligible for new requests, load aside."""
        if self.report is not None and (self.report.draining or not self.report.ready):
            return False
        return self.ready and self.healthy and self.accepting and self.breaker_available

    @property
    def _delta(self) -> int:
        return self.inflight - self.inflight_at_report

    @property
    def est_waiting(self) -> int:
        return self.report.num_waiting if self.report is not None else 0

    @property
    def est_running(self) -> int:
        if self.report is None:
            return self.inflight
        return max(0, self.report.num_running + self._delta)

    @property
    def est_load(self) -> int:
        """Requests on the instance now, as best known: running plus waiting."""
        if self.report is None:
            return self.inflight
        reported = self.report.num_running + self.report.num_waiting
        return max(self.inflight, reported + self._delta)
