"""The pacing rule: base lines in flight unless the window needs more, then in proportion."""

from __future__ import annotations

from llmserve.gateway.batches.pace import base_in_flight, lines_in_flight, required_rate, told_need


def test_a_batch_on_time_keeps_the_base():
    assert lines_in_flight(4, 64, remaining=1000, lines_per_s=10.0, seconds_left=3600) == 4
    assert lines_in_flight(4, 64, remaining=1000, lines_per_s=None, seconds_left=3600) == 4  # not measured yet
    assert lines_in_flight(4, 64, remaining=0, lines_per_s=10.0, seconds_left=3600) == 0


def test_a_batch_behind_gets_more_in_proportion_up_to_the_ceiling():
    # 1000 lines in 100 s at 80 %: 12.5 lines/s needed, 5 seen -> 2.5x the base
    assert lines_in_flight(4, 64, remaining=1000, lines_per_s=5.0, seconds_left=100) == 10
    assert lines_in_flight(4, 64, remaining=100_000, lines_per_s=5.0, seconds_left=100) == 64
    assert lines_in_flight(4, 64, remaining=10, lines_per_s=5.0, seconds_left=0) == 64


def test_the_base_is_per_ready_instance_up_to_the_ceiling():
    assert [base_in_flight(4, n, 64) for n in (0, 1, 3, 16, 17)] == [4, 4, 12, 64, 64]
    assert base_in_flight(4, 3, 2) == 2


def test_the_need_is_told_only_while_the_pace_falls_short():
    need = required_rate(1000, 3600)
    assert told_need(1000, 3600, None) == 0.0  # measure with the idle seats filled first
    assert told_need(1000, 3600, need * 1.01) == 0.0  # idle capacity carries it: no instance for the batch
    assert told_need(1000, 3600, need * 0.5) == need  # behind: the whole rate the window needs
    assert told_need(0, 3600, 0.0) == 0.0
