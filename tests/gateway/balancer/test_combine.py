"""The picker's weighted mean gives the same bits as adding the clamped columns one at a time."""

import random

from llmserve.gateway.balancer.combine import weighted_mean

_ODD = [0.0, -0.0, 1.0, 0, 1, 2, -1, 0.5, 1e-300, float("nan"), float("inf"), -float("inf")]


def _one_column_at_a_time(columns, weights):
    clamp = lambda s: s if 0.0 < s < 1.0 else (1.0 if s >= 1.0 else 0.0)  # noqa: E731
    acc = [weights[0] * clamp(s) for s in columns[0]]
    for col, w in zip(columns[1:], weights[1:]):
        acc = [a + w * clamp(s) for a, s in zip(acc, col)]
    return [a / sum(weights) for a in acc]


def _bits(values):
    return [v.hex() for v in values]


def test_same_bits_as_one_column_at_a_time():
    rng = random.Random(7)
    for _ in range(5_000):
        n, k = rng.randint(0, 6), rng.randint(1, 6)
        columns = []
        for _ in range(k):
            kind = rng.random()
            columns.append([0.0] * n if kind < 0.25 else [rng.choice(_ODD) for _ in range(n)] if kind < 0.5
                           else [rng.random() for _ in range(n)])
        weights = [rng.choice([1.0, 0.5, 2.0, float("inf"), rng.random() + 1e-3]) for _ in range(k)]
        want = _one_column_at_a_time(columns, weights)
        got = weighted_mean(columns, weights, sum(weights))
        assert _bits(got) == _bits(want), (columns, weights)


def test_an_all_zero_column_is_skipped_but_still_weighs_in_the_mean():
    assert weighted_mean([[1.0, 0.5], [0.0, 0.0]], [1.0, 3.0], 4.0) == [0.25, 0.125]
    assert weighted_mean([[0.0, 0.0], [1.0, 2.0]], [1.0, 1.0], 2.0) == [0.5, 0.5]  # first column all zero; 2 clamps to 1
