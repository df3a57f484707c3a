"""The project's one percentile: nearest rank, the same from a list, a sorted list or an array."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmserve.percentiles import percentile, percentiles


def test_nearest_rank_is_a_value_of_the_data_and_numpys_inverted_cdf():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 100, 1001):
        xs = rng.exponential(1.0, n)
        for q in (0, 1, 50, 90, 99, 99.9, 100):
            want = float(np.percentile(xs, q, method="inverted_cdf"))
            assert percentile(xs, q) == pytest.approx(want)  # an array
            assert percentile(xs.tolist(), q) == pytest.approx(want)  # a list, any order
            assert percentile(sorted(xs.tolist()), q, is_sorted=True) == pytest.approx(want)
            assert want in xs


def test_exact_ranks_do_not_round_up_and_nans_and_empties():
    xs = [float(i) for i in range(1, 101)]
    assert [percentile(xs, q) for q in (0, 50, 99, 100)] == [1.0, 50.0, 99.0, 100.0]
    assert percentile([3.0, math.nan, 1.0, 2.0], 50) == 2.0
    assert percentile(np.array([math.nan, 5.0]), 99) == 5.0
    assert percentile([], 50) is None and math.isnan(percentile(np.array([math.nan]), 50, empty=math.nan))


def test_several_at_once_are_each_one_exactly():
    from collections import deque
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 100, 7200):
        window = deque(rng.lognormal(0.0, 1.0, n).tolist())
        got = percentiles(window, (50, 99, 100))
        assert got == [percentile(sorted(window), q, is_sorted=True) for q in (50, 99, 100)]
    assert percentiles(deque(), (50, 99)) == [None, None]
