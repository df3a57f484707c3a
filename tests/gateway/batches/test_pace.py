"""The pacing rule: base lines in flight unless the window needs more, then in proportion."""

from __future__ import annotations

from llmserve.gateway.batches.pace import lines_in_flight


def test_a_batch_on_time_keeps_the_base():
    assert lines_in_flight(4, 64, remaining=1000, lines_per_s=10.0, seconds_left=3600) == 4
    assert lines_in_flight(4, 64, remaining=1000, lines_per_s=None, seconds_left=3600) == 4  # not measured yet
    assert lines_in_flight(4, 64, remaining=0, lines_per_s=10.0, seconds_left=3600) == 0


def test_a_batch_behind_gets_more_in_proportion_up_to_the_ceiling():
    # 1000 lines in 100 s at 80 %: 12.5 lines/s needed, 5 seen -> 2.5x the base
    assert lines_in_flight(4, 64, remaining=1000, lines_per_s=5.0, seconds_left=100) == 10
    assert lines_in_flight(4, 64, remaining=100_000, lines_per_s=5.0, seconds_left=100) == 64
    assert lines_in_flight(4, 64, remaining=10, lines_per_s=5.0, seconds_left=0) == 64
