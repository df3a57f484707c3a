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


def test_each_model_is_told_its_batches_required_rate_then_zero(tmp_path):
    runner = BatchRunner(None, BatchConfig(), tmp_path / "batches.lock")  # type: ignore[arg-type]
    needs = Needs()
    runner.observers.append(needs)
    runner._models.update({"b1": "m", "b2": "m", "b3": "other"})
    now = 1000.0
    runner._allowed([batch("b1", 100, 10, now + 3600), batch("b2", 50, 0, now + 7200),
                     batch("b3", 10, 10, now + 60)], now)
    told = dict(needs.told)
    assert told["m"] == pytest.approx(required_rate(90, 3600) + required_rate(50, 7200))
    assert told["other"] == 0.0  # finished: nothing needed
    needs.told.clear()
    runner._allowed([], now + 1)  # the batches ended: the models are told so once
    assert sorted(needs.told) == [("m", 0.0), ("other", 0.0)]
    needs.told.clear()
    runner._allowed([], now + 2)
    assert needs.told == []
