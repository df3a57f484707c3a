"""The batch runner tells the autoscaler what each model's batch windows need (issue 33)."""

from __future__ import annotations

import pytest

from llmserve.gateway.batches.config import BatchConfig
from llmserve.gateway.batches.pace import required_rate
from llmserve.gateway.batches.runner import BatchRunner


class Needs:
    def __init__(self) -> None:
        self.told: list[tuple[str, float]] = []

    def on_batch_need(self, model: str, lines_per_s: float) -> None:
        self.told.append((model, lines_per_s))


def batch(bid: str, total: int, done: int, expires_at: float) -> dict:
    return {"id": bid, "request_counts": {"total": total, "completed": done, "failed": 0}, "expires_at": expires_at}


def test_each_model_is_told_the_rate_its_windows_need_only_while_behind_then_zero(tmp_path):
    runner = BatchRunner(None, BatchConfig(), tmp_path / "batches.lock")  # type: ignore[arg-type]
    needs = Needs()
    runner.observers.append(needs)
    runner._models.update({"b1": "m", "b2": "m", "b3": "other"})
    now = 1000.0
    runner._allowed([batch("b1", 1000, 10, now + 3600), batch("b2", 50, 0, now + 7200),
                     batch("b3", 10, 10, now + 60)], now)
    assert dict(needs.told) == {"m": 0.0, "other": 0.0}  # no pace measured yet: idle seats first
    needs.told.clear()
    # 20 s on: b1 finished 1 line (behind its window), b2 40 (idle seats carry it)
    runner._allowed([batch("b1", 1000, 11, now + 3600), batch("b2", 50, 40, now + 7200),
                     batch("b3", 10, 10, now + 60)], now + 20)
    told = dict(needs.told)
    assert told["m"] == pytest.approx(required_rate(989, 3580))
    assert told["other"] == 0.0  # finished: nothing needed
    needs.told.clear()
    runner._allowed([], now + 21)  # the batches ended: the models are told so once
    assert sorted(needs.told) == [("m", 0.0), ("other", 0.0)]
    needs.told.clear()
    runner._allowed([], now + 22)
    assert needs.told == []


def test_lines_in_flight_scale_with_the_ready_instances(tmp_path):
    runner = BatchRunner(None, BatchConfig(concurrency=4, max_concurrency=64), tmp_path / "l")  # type: ignore[arg-type]
    assert runner._allowed([], 0.0) == 4
    runner.ready_instances = lambda: 5
    assert runner._allowed([], 0.0) == 20
    runner.ready_instances = lambda: 40
    assert runner._allowed([], 0.0) == 64  # the ceiling
