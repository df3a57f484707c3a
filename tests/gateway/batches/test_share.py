"""The batch share of seats: the full batch room while the forecast leaves the pool idle,
little near the peak, the plain concurrency without a forecast."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.gateway.batches.config import BatchConfig, BatchShareConfig
from llmserve.gateway.batches.share import base_lines, lines_per_instance


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
    assert base_lines(share, 2, 64, 0.3, 3) == 18
    assert base_lines(share, 2, 64, 0.3, 30) == 64
    assert base_lines(share, 2, 64, 9.0, 10) == 1  # the pace still gets measured near the peak
    assert base_lines(share, 2, 64, None, 3) == 6  # another policy: 2 per ready instance
    assert base_lines(None, 2, 64, 0.3, 3) == 6  # share off


def test_the_share_config_is_ordered():
    assert BatchConfig().share == BatchShareConfig()
    with pytest.raises(ValidationError, match="peak must not exceed trough"):
        BatchShareConfig(trough=2, peak=3)
    with pytest.raises(ValidationError, match="peak_load must exceed trough_load"):
        BatchShareConfig(trough_load=0.8, peak_load=0.5)
    assert BatchConfig.model_validate({"share": None}).share is None
