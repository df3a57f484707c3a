"""Instance-seconds and peak count from spans and from the admin event log."""

from __future__ import annotations

import pytest

from llmserve.autoscale.usage import (classes_from_events, dollars, held_seconds, instance_seconds, peak_held,
                                     spans_from_events)


def ev(seq, t, iid, old, new, kind="transition"):
    return {"seq": seq, "time": t, "instance_id": iid, "kind": kind, "old": old, "new": new}


EVENTS = [
    ev(1, 0.0, "a", None, "starting"),
    ev(2, 5.0, "a", "starting", "ready"),
    ev(3, 5.0, "a", "ready", "ready", kind="pool_add"),
    ev(4, 10.0, "b", None, "starting"),
    ev(7, 30.0, "b", "draining", "stopped"),
    ev(5, 12.0, "c", None, "starting"),
    ev(6, 14.0, "c", "starting", "failed"),
    ev(8, 40.0, "d", None, "starting"),  # still held at the end
]


def test_spans_from_the_event_log_in_any_page_order():
    spans = spans_from_events(reversed(EVENTS))
    assert spans == {"a": (0.0, None), "b": (10.0, 30.0), "c": (12.0, 14.0), "d": (40.0, None)}


def test_held_seconds_clips_to_the_window_and_runs_open_spans_to_its_end():
    spans = list(spans_from_events(EVENTS).values())
    # a: 0..50, b: 10..30, c: 12..14, d: 40..50
    assert held_seconds(spans, 0.0, 50.0) == pytest.approx(50 + 20 + 2 + 10)
    assert held_seconds(spans, 20.0, 35.0) == pytest.approx(15 + 10)
    assert instance_seconds(EVENTS, 0.0, 50.0) == pytest.approx(82.0)
    assert held_seconds(spans, 60.0, 70.0) == pytest.approx(20.0)  # a and d are still held


def test_peak_counts_overlaps_within_the_window_only():
    spans = list(spans_from_events(EVENTS).values())
    assert peak_held(spans, 0.0, 50.0) == 3  # a, b, c at 12..14
    assert peak_held(spans, 15.0, 50.0) == 2
    assert peak_held(spans, 31.0, 39.0) == 1
    # One instance replacing another at the same moment is never two held at once.
    assert peak_held([(0.0, 5.0), (5.0, 10.0)], 0.0, 10.0) == 1
    assert peak_held([], 0.0, 10.0) == 0


def test_dollars_price_each_instance_at_its_class_and_a_spot_fallback_at_on_demand():
    events = [dict(e, details={"capacity_class": "spot"}) if e["instance_id"] in "bd" and e["old"] is None else e
              for e in EVENTS]
    events.append(ev(9, 40.5, "d", "spot", "on_demand", kind="spot_fallback"))
    assert classes_from_events(events) == {"a": "on_demand", "b": "spot", "c": "on_demand", "d": "on_demand"}
    prices = {"on_demand": 3600.0, "spot": 1800.0}  # $ per hour: 1 and 0.5 per second
    # a 50 s, c 2 s, d 10 s on-demand; b 20 s on spot
    assert dollars(events, prices, 0.0, 50.0) == pytest.approx(50 + 2 + 10 + 20 * 0.5)
