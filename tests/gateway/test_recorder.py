"""The request recorder: the one place a request feeds the gateway's metrics, the
canary's evidence and the observers."""

from types import SimpleNamespace

import pytest

from llmserve.gateway.metrics import GatewayMetrics
from llmserve.gateway.recorder import RecordSinks, RequestRecord
from llmserve.gateway.request import prompt_chars
from llmserve.gateway.canary_evidence import Outcome
from llmserve.priority import PriorityClass


class Observer:
    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def on_arrival(self, model, version, t, chars, batch=False):
        self.seen.append(("arrival", model, version, chars) + (("batch",) if batch else ()))

    def on_first_token(self, model, version, t, ttft_s, batch=False):
        self.seen.append(("first_token", model, version) + (("batch",) if batch else ()))

    def on_finish(self, model, version, t, e2e_s, output_tokens, ok, batch=False):
        self.seen.append(("finish", model, version, output_tokens, ok) + (("batch",) if batch else ()))


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Outcome]] = []

    def record(self, version, now, outcome):
        self.seen.append((version, outcome))


def _record(observers: list, outcomes=None, cls=PriorityClass.REALTIME) -> tuple[RequestRecord, GatewayMetrics]:
    metrics = GatewayMetrics(lambda: [])
    sinks = RecordSinks("m", metrics, outcomes, observers)
    parsed = SimpleNamespace(body={"prompt": "hello"}, priority_class=cls, prompt_chars=5)
    return RequestRecord(sinks, "v1", parsed, 0.0, "r1"), metrics


def _value(metrics: GatewayMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(f"llmserve:gateway_{name}", labels)


def test_a_request_feeds_every_counter_through_its_record():
    obs = Observer()
    rec, m = _record([obs])
    rec.arrived("weight")
    rec.waited(0.25, cold=True)
    rec.sent("i1")
    rec.retried()
    rec.sent("i2")
    rec.resumed("resumed")
    rec.first_token()
    rec.first_token()  # once
    rec.output_tokens = 3
    rec.finish(200, ok=True)
    assert _value(m, "routed_total", model="m", version="v1", reason="weight") == 1
    assert _value(m, "upstream_requests_total", model="m", version="v1", instance="i1") == 1
    assert _value(m, "upstream_requests_total", model="m", version="v1", instance="i2") == 1
    assert _value(m, "retries_total", model="m", version="v1") == 1
    assert _value(m, "stream_resumes_total", model="m", version="v1", outcome="resumed") == 1
    assert _value(m, "cold_start_wait_seconds_sum", model="m", version="v1") == 0.25
    assert _value(m, "queue_time_seconds_sum", model="m", version="v1", **{"class": "realtime"}) == 0.25
    assert rec.instance == "i2" and rec.ttft_s is not None
    assert obs.seen == [("arrival", "m", "v1", 5), ("first_token", "m", "v1"), ("finish", "m", "v1", 3, True)]


def test_the_observers_are_told_a_batch_class_request_is_one():
    """The autoscaler keeps batch work apart from realtime demand (issue 33)."""
    obs = Observer()
    rec, _ = _record([obs], cls=PriorityClass.BATCH)
    rec.arrived("weight")
    rec.first_token()
    rec.finish(200, ok=True)
    assert [e[-1] for e in obs.seen] == ["batch", "batch", "batch"]


def test_a_warm_wait_is_no_cold_start_and_no_observers_means_no_token_count():
    rec, m = _record([])
    rec.waited(0.5, cold=False)
    assert _value(m, "cold_start_wait_seconds_count", model="m", version="v1") is None
    assert rec.queued_s == 0.5


def test_prompt_chars_counts_text_of_chats_and_prompts():
    assert prompt_chars({"messages": [{"content": "ab"}, {"content": [{"text": "cde"}]}]}) == 5
    # a token id is a token's characters (4), not one: a key's estimate would be 4x low
    assert prompt_chars({"prompt": ["ab", [1, 2, 3], 7]}) == 2 + 3 * 4 + 4
    assert prompt_chars({}) == 0
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * 300}}]
    assert prompt_chars({"messages": [{"content": "ab"}], "tools": tools}) > 300  # the template writes them in


def test_the_canary_evidence_gets_every_failed_attempt_and_the_answer():
    """A retried failure counts against the version: retries on the same pool would
    otherwise hide most of a faulty canary's errors (issue 36)."""
    out = Outcomes()
    rec, _ = _record([], out)
    rec.sent("i1")
    rec.retried()
    rec.attempt_failed(None)  # a 5xx answer
    rec.attempt_failed("upstream_broken")
    rec.first_token()
    rec.output_tokens = 5
    rec.finish(200, ok=True)
    kinds = [(v, o.error) for v, o in out.seen]
    assert kinds == [("v1", "upstream_5xx"), ("v1", "upstream_broken"), ("v1", None)]
    last = out.seen[-1][1]
    assert last.output_tokens == 5 and last.ttft_s is not None and last.e2e_s >= last.ttft_s
    assert last.tpot_s == pytest.approx((last.e2e_s - last.ttft_s) / 4)


def test_a_4xx_from_the_version_is_a_refusal_and_a_disconnect_is_nothing():
    out = Outcomes()
    rec, _ = _record([], out)
    rec.sent("i1")
    rec.finish(400, ok=True)
    rec2, _ = _record([], out)
    rec2.sent("i1")
    rec2.finish(499, ok=True, error_kind="client_disconnected")
    rec3, _ = _record([], out)
    rec3.finish(503, ok=False, error_kind="no_healthy_instance")
    assert [(o.refused, o.error) for _, o in out.seen] == [(True, None), (False, "no_healthy_instance")]
    assert rec.sinks.outcomes is not None  # the analysis compares output lengths
