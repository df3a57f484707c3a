"""The batch share of seats: the full batch room while the forecast leaves the pool idle,
little near the peak, the plain concurrency without a forecast."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.gateway.batches.config import BatchConfig, BatchShareConfig
from llmserve.gateway.admission import ConcurrencyConfig
from llmserve.gateway.batches.share import base_lines, batch_room, lines_per_instance


def per(load, ready=10):
    return lines_per_instance(load, ready, plain=2, trough=6, peak=0, trough_load=0.1, peak_load=0.75)


def test_the_share_follows_the_forecast_load_of_the_ready_pool():
    assert per(None) == 2  # no forecast: the plain concurrency
    assert per(0.0) == per(1.0) == 6  # the trough: each instance's batch room
    assert per(7.5) == per(20.0) == 0  # at and past the peak load: none
    assert [per(x) for x in (2.0, 3.0, 4.0, 5.0, 6.0, 7.0)] == [5, 4, 3, 2, 1, 0]  # in proportion between
    assert per(3.0, ready=3) == 0 and per(3.0, ready=30) == 6  # the same load on a bigger pool leaves room


def test_the_base_is_the_share_per_ready_instance_up_to_the_ceiling_and_one_at_least():
    share = BatchShareConfig(trough=6, peak=0, trough_load=0.1, peak_load=0.75)
    assert base_lines(share, 2, 64, 0.3, 3, room=40) == 18  # (a trough named: the room does not count)
    assert base_lines(share, 2, 64, 0.3, 30, room=6) == 64
    assert base_lines(share, 2, 64, 9.0, 10, room=6) == 1  # the pace still gets measured near the peak
    assert base_lines(share, 2, 64, None, 3, room=6) == 6  # another policy: 2 per ready instance
    assert base_lines(None, 2, 64, 0.3, 3, room=6) == 6  # share off


def test_the_trough_is_each_instances_batch_room_unless_named():
    c = ConcurrencyConfig()
    assert batch_room([(8, c)] * 3) == 6  # 8 seats less the realtime reserve's quarter
    assert batch_room([(128, c)]) == 96 and batch_room([(8, c), (128, c)]) == 51
    assert batch_room([]) == batch_room([(0, c)]) == 6  # none known: the default 8 seats'
    assert batch_room([(8, ConcurrencyConfig(realtime_reserve=0.5))]) == 4
    assert batch_room([(1, c)]) == 1  # never below one
    derived = BatchShareConfig()  # trough None: the room
    assert base_lines(derived, 2, 1000, 0.3, 3, room=96) == 3 * 96
    assert base_lines(derived, 2, 1000, 0.3, 3, room=6) == 18
    # the peak is capped at the room: a named peak above a small derived trough is not an error
    assert base_lines(BatchShareConfig(peak=4), 2, 1000, 9.0, 3, room=2) == 6


def test_the_share_config_is_ordered():
    assert BatchConfig().share == BatchShareConfig()
    with pytest.raises(ValidationError, match="peak must not exceed trough"):
        BatchShareConfig(trough=2, peak=3)
    with pytest.raises(ValidationError, match="peak_load must exceed trough_load"):
        BatchShareConfig(trough_load=0.8, peak_load=0.5)
    assert BatchConfig.model_validate({"share": None}).share is None
