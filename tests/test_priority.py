"""The one priority parser: names, integers and digit strings, bounded; nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmserve.priority import (BATCH, NAMED_RANGE, REALTIME, WIRE_MAX, WIRE_MIN, WIRE_RANGE,
                               PriorityClass, PriorityRange, parse_priority)


@pytest.mark.parametrize("value,expected", [
    (None, None), ("realtime", REALTIME), ("batch", BATCH), (" Batch ", BATCH), ("REALTIME", 0),
    (0, 0), (-5, -5), (7, 7), ("7", 7), ("-3", -3), ("+2", 2), (" 12 ", 12),
    (PriorityClass.BATCH, 1), (str(WIRE_MIN), WIRE_MIN), (WIRE_MAX, WIRE_MAX), (-1000000000, -1000000000)])
def test_accepted(value, expected):
    assert parse_priority(value) == expected


@pytest.mark.parametrize("bad", [
    True, False, 1.0, 1.5, "urgent", "", " ", "1.0", "1e3", "--1", "0x10", "١", "²", "1_000",
    [], {}, "1" * 5000, "-" + "9" * 5000, WIRE_MAX + 1, WIRE_MIN - 1, "0" * 12])
def test_rejected_with_a_value_error(bad):
    with pytest.raises(ValueError, match="priority must be"):
        parse_priority(bad)


def test_huge_integers_are_rejected_without_printing_them():
    for bad in (10 ** 5000, -(10 ** 5000)):  # str() of these raises its own ValueError
        with pytest.raises(ValueError, match="an integer of 16610 bits"):
            parse_priority(bad)


def test_a_range_bounds_integers_and_names_alike():
    assert parse_priority("batch", NAMED_RANGE) == 1
    assert parse_priority(0, NAMED_RANGE) == 0
    for bad in (-1, 2, "-1", "2"):
        with pytest.raises(ValueError, match=r"in \[0, 1\]"):
            parse_priority(bad, NAMED_RANGE)
    with pytest.raises(ValueError):
        parse_priority("batch", PriorityRange(-10, 0))


def test_ranges_are_checked():
    for lo, hi in ((1, 0), (WIRE_MIN - 1, 0), (0, WIRE_MAX + 1), (True, 1), (0.0, 1)):
        with pytest.raises(ValueError):
            PriorityRange(lo, hi)
    assert 5 in PriorityRange(-5, 5) and 6 not in PriorityRange(-5, 5)


def test_classes_split_at_zero_like_the_engine():
    assert [PriorityClass.of(p) for p in (-7, 0, 1, 9)] == [PriorityClass.REALTIME] * 2 + [PriorityClass.BATCH] * 2
    assert (PriorityClass.REALTIME.level, PriorityClass.BATCH.level) == (REALTIME, BATCH)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


@given(st.one_of(_json, st.integers().map(str), st.from_regex(r"\s*[+-]?\d{0,14}\s*", fullmatch=True),
                 st.sampled_from(["realtime", "batch"]).map(lambda s: s.swapcase())),
       st.integers(WIRE_MIN, WIRE_MAX), st.integers(0, 2**32))
def test_any_input_gives_a_bounded_int_none_or_a_value_error(value, lo, width):
    allowed = PriorityRange(lo, min(WIRE_MAX, lo + width))
    try:
        got = parse_priority(value, allowed)
    except ValueError:
        return
    if value is None:
        assert got is None
    else:
        assert type(got) is int and got in allowed and got in WIRE_RANGE
