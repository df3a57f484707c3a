"""The runner over fake upstreams: lines go out at the batch class, and a full pool
(503) is waited out rather than failing the line."""

from __future__ import annotations

import io
import json

import openai
import pytest

from llmserve.priority import PriorityClass
from tests.gateway.app_harness import stack, wait_until
from tests.gateway.fake_upstream import Behaviour


def _file(n: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "chat", "messages": [{"role": "user", "content": f"q{i}"}], "priority": "realtime"}}).encode() + b"\n"
        for i in range(n))


def test_lines_run_at_the_batch_class_and_wait_out_a_full_pool(tmp_path):
    b = Behaviour("i0", error_rate=1.0, error_status=503)
    # 4 lines in flight; the breaker opens after 5 consecutive 503s, so 5 tries (one line
    # retried at least) always reach the upstream, and up to 8 when the lines interleave
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}, batches={"poll_interval_s": 0.05, "concurrency": 4,
                                                                    "retry_interval_s": 0.05}) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        f = c.files.create(file=("in.jsonl", io.BytesIO(_file(4))), purpose="batch")
        batch = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: b.requests >= 5, what="retries")
        assert c.batches.retrieve(batch.id).request_counts.completed == 0
        b.error_rate = 0.0
        wait_until(lambda: c.batches.retrieve(batch.id).status == "completed", timeout=10, what="completed")
        done = c.batches.retrieve(batch.id)
        assert done.request_counts.completed == 4 and done.request_counts.failed == 0
        # the line claimed realtime; the runner's privileges allow the batch class only
        assert {h.get("x-priority") for h in b.headers} == {str(PriorityClass.BATCH.level)}


def test_two_batches_share_one_seat_and_both_complete(tmp_path):
    b = Behaviour("i0")
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}, batches={"poll_interval_s": 0.05, "concurrency": 1}) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        ids = [c.batches.create(input_file_id=c.files.create(file=("in.jsonl", io.BytesIO(_file(3))),
                                                            purpose="batch").id,
                                endpoint="/v1/chat/completions", completion_window="24h").id for _ in range(2)]
        wait_until(lambda: all(c.batches.retrieve(i).status == "completed" for i in ids), timeout=10,
                   what="both completed")
        assert [c.batches.retrieve(i).request_counts.completed for i in ids] == [3, 3]
        assert b.max_running == 1


def test_the_runner_measures_a_batch_pace_and_widens_only_when_its_window_needs_it(tmp_path):
    from pathlib import Path

    from llmserve.gateway.batches.config import BatchConfig
    from llmserve.gateway.batches.runner import BatchRunner
    from llmserve.gateway.batches.store import BatchStore

    r = BatchRunner(BatchStore(tmp_path / "b.db"), BatchConfig(concurrency=4, max_concurrency=64), Path("x"))

    def batch(done: int, left_s: float, t: float) -> dict:
        return {"id": "b", "expires_at": t + left_s, "request_counts": {"total": 10_000, "completed": done,
                                                                         "failed": 0}}

    assert r._allowed([batch(0, 3600, 0.0)], 0.0) == 4  # no pace yet
    assert r._allowed([batch(500, 3590, 10.0)], 10.0) == 4  # 50 lines/s, 9,500 left in an hour: on time
    assert r._allowed([batch(520, 20, 20.0)], 20.0) > 4  # 26 lines/s, 9,480 left in 20 s: behind


def test_the_runner_follows_the_controllers_forecast(tmp_path):
    from pathlib import Path
    from types import SimpleNamespace

    from llmserve.gateway.batches.config import BatchConfig
    from llmserve.gateway.batches.runner import BatchRunner
    from llmserve.gateway.batches.store import BatchStore

    r = BatchRunner(BatchStore(tmp_path / "b.db"), BatchConfig(), Path("x"))
    r.ready_instances = lambda: 4
    batches = [{"id": "b", "expires_at": 86_400.0, "request_counts": {"total": 100, "completed": 0, "failed": 0}}]
    assert r._allowed(batches, 0.0) == 8  # no controller with a forecast: 2 per ready instance
    trough, peak = SimpleNamespace(realtime_load=0.2), SimpleNamespace(realtime_load=0.2)
    r.observers = [trough, peak, SimpleNamespace(realtime_load=None), object()]
    assert r.realtime_load() == pytest.approx(0.4)
    assert r._allowed(batches, 0.0) == 24  # a tenth of 4 instances forecast busy: each one's batch room
    peak.realtime_load = 3.0
    assert r._allowed(batches, 0.0) == 1  # near the peak: one line, to keep measuring the pace


def test_one_keys_backlog_does_not_hold_another_keys_batch_back(tmp_path):
    """One seat; key A's 8-line batch first, then key B's 1-line batch: B's line runs after at most
    one of A's more, not after all of them (the oldest batch took every free seat)."""
    b = Behaviour("i0", first_token_delay_s=0.15)
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}, batches={"poll_interval_s": 0.05, "concurrency": 1}) as s:
        a, other = (openai.OpenAI(base_url=s.url + "/v1", api_key=k, max_retries=0) for k in ("key-a", "key-b"))

        def start(c: openai.OpenAI, n: int) -> str:
            f = c.files.create(file=("in.jsonl", io.BytesIO(_file(n))), purpose="batch")
            return c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id

        big = start(a, 8)
        wait_until(lambda: b.requests >= 1, what="A's first line sent")
        small = start(other, 1)
        wait_until(lambda: other.batches.retrieve(small).status == "completed", timeout=10, what="B's batch")
        assert a.batches.retrieve(big).request_counts.completed <= 3
        wait_until(lambda: a.batches.retrieve(big).status == "completed", timeout=15, what="A's batch")
        assert b.max_running == 1
