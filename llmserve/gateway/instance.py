"""What the gateway's pure decision code sees of one upstream instance."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmserve.load_report import LoadReport

NOT_REPORTED = -1  # InstanceView.seats of an instance with no load report yet


# Not frozen: a frozen dataclass sets each field through object.__setattr__, which made
# building a view (once per load change, for every request) 6x dearer. Nothing writes to one.
@dataclass(slots=True)
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

    # Kept at construction (a view is read by every pick and scorer of a round, built once; and
    # a report's field costs ~10x a view's to read: pydantic's __getattr__ hook defeats the
    # interpreter's attribute cache, so each is read here once):
    routable: bool = field(init=False, repr=False, compare=False)  # eligible for new requests, load aside
    est_waiting: int = field(init=False, repr=False, compare=False)
    est_running: int = field(init=False, repr=False, compare=False)
    est_load: int = field(init=False, repr=False, compare=False)  # running plus waiting, as best known
    seats: int = field(init=False, repr=False, compare=False)  # the reported max_num_seqs (-1: no report yet)
    kv_usage: float | None = field(init=False, repr=False, compare=False)  # the report's (None: no report)
    busy_fraction: float | None = field(init=False, repr=False, compare=False)  # the report's (None: no report)

    def __post_init__(self) -> None:
        r = self.report
        if r is None:
            self.routable = self.ready and self.healthy and self.accepting and self.breaker_available
            self.seats = NOT_REPORTED
            self.est_waiting = 0
            self.est_running = self.est_load = self.inflight
            self.kv_usage = self.busy_fraction = None
            return
        self.routable = (self.ready and self.healthy and self.accepting and self.breaker_available
                         and not (r.draining or not r.ready))
        self.seats = r.max_num_seqs
        self.kv_usage, self.busy_fraction = r.kv_cache_usage, r.busy_fraction
        delta = self.inflight - self.inflight_at_report
        running, waiting = r.num_running, r.num_waiting
        self.est_waiting = waiting
        self.est_running = max(0, running + delta)
        self.est_load = max(self.inflight, running + waiting + delta)
