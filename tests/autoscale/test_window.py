"""The sample window drops and keeps exactly what a pair of deques pruned from the front did."""

import random
from collections import deque

import numpy as np

from llmserve.autoscale import window
from llmserve.autoscale.window import SampleWindow


def test_same_samples_as_deques_through_appends_prunes_and_compactions(monkeypatch):
    monkeypatch.setattr(window, "_COMPACT_AT", 8)  # compact often
    rng = random.Random(3)
    w, times, values = SampleWindow(), deque(), deque()
    t = 0.0
    for _ in range(5_000):
        if rng.random() < 0.7:
            t += rng.choice([0.0, 0.0, 0.1, 0.5, 1.0])  # equal times too
            v = rng.random()
            w.append(t, v)
            times.append(t)
            values.append(v)
        else:
            since = t - rng.choice([0.0, 0.5, 2.0, 5.0])
            w.prune(since)
            while times and times[0] <= since:
                times.popleft()
                values.popleft()
        assert len(w) == len(values)
    assert w.values().tolist() == list(values)


def test_values_are_a_copy_so_the_window_still_grows():
    w = SampleWindow()
    w.append(0.0, 1.5)
    held = w.values()
    w.append(1.0, 2.5)  # no BufferError: nothing exports the arrays
    w.prune(0.0)
    assert held.tolist() == [1.5] and w.values().tolist() == [2.5]
    assert w.values().dtype == np.float64
