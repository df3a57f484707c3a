"""What a pool held over a window of time: instance-seconds and the peak count.

An instance is held (billed) from the moment it is asked for until it has
stopped or failed, cold start and draining included; that is what a cloud bill
counts. Both the live controller's event log (``/admin/autoscale/events``) and
the simulator's instance lifetimes reduce to spans ``(start, end)``, with
``end`` None while the instance is still held, so one pair of functions prices
both and a live run and a simulated one are compared on the same definition.
:func:`dollars` prices the same spans at each instance's capacity class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Span = tuple[float, float | None]


def spans_from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, Span]:
    """Each instance's span from the admin event log (``transition`` events, any order of pages)."""
    spans: dict[str, Span] = {}
    for e in sorted(events, key=lambda e: e["seq"]):
        if e["kind"] != "transition":
            continue
        iid = e["instance_id"]
        if e["old"] is None:
            spans[iid] = (e["time"], None)
        elif e["new"] in ("stopped", "failed") and iid in spans:
            spans[iid] = (spans[iid][0], e["time"])
    return spans


def held_seconds(spans: Iterable[Span], t0: float, t1: float) -> float:
    """Instance-seconds held within ``[t0, t1]``; an open span runs to ``t1``."""
    total = 0.0
    for start, end in spans:
        stop = t1 if end is None else min(end, t1)
        total += max(0.0, stop - max(start, t0))
    return total


def peak_held(spans: Sequence[Span], t0: float, t1: float) -> int:
    """The most instances held at once at any moment within ``[t0, t1]``."""
    edges = []
    for start, end in spans:
        a, b = max(start, t0), t1 if end is None else min(end, t1)
        if b > a:
            edges += [(a, 1), (b, -1)]
    peak = held = 0
    # At equal times a stop comes before a start: a replacement is not two instances.
    for _, step in sorted(edges):
        held += step
        peak = max(peak, held)
    return peak


def instance_seconds(events: Iterable[Mapping[str, Any]], t0: float, t1: float) -> float:
    """Instance-seconds held within ``[t0, t1]``, from the admin event log."""
    return held_seconds(spans_from_events(events).values(), t0, t1)


def classes_from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Each instance's capacity class: the one it was launched in, on-demand after a
    ``spot_fallback`` (refused spot is started on-demand); on-demand when unnamed."""
    out: dict[str, str] = {}
    for e in sorted(events, key=lambda e: e["seq"]):
        if e["kind"] == "transition" and e["old"] is None:
            out[e["instance_id"]] = (e.get("details") or {}).get("capacity_class", "on_demand")
        elif e["kind"] == "spot_fallback":
            out[e["instance_id"]] = e["new"]
    return out


def dollars(events: Sequence[Mapping[str, Any]], prices: Mapping[str, float], t0: float, t1: float) -> float:
    """Money spent within ``[t0, t1]``, from the admin event log: each instance's held
    time at its class's price per instance-hour."""
    spans, classes = spans_from_events(events), classes_from_events(events)
    return sum(held_seconds([span], t0, t1) * prices[classes.get(iid, "on_demand")]
               for iid, span in spans.items()) / 3600.0
