"""Per-key limits through a real gateway (one process, in-memory counters) in front of
fake upstreams: 429s with Retry-After and OpenAI's error JSON, concurrency, budgets,
a stream stopped when its budget runs out, usage by name, never by secret."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError

from llmserve.gateway.config import GatewayConfig
from tests.gateway.app_harness import ADMIN_KEY, sse_events, stack, wait_until
from tests.gateway.fake_upstream import Behaviour

KEY = "team-a-secret-0123"
OTHER = "team-b-secret-4567"


@pytest.fixture
def auth(tmp_path):
    """The stack's settings for key team-a with ``limits`` (and an unlimited team-b)."""
    def settings(limits: dict, *, unnamed: bool = False) -> dict:
        keys = [{"key": KEY, "name": "team-a", "limits": limits}, {"key": OTHER, "name": "team-b"}]
        plain = {"api_keys": ["plain-key-0123"]} if unnamed else {}
        return {"auth": {"admin_key": ADMIN_KEY, "keys": keys, **plain}, "state": {"dir": str(tmp_path)}}
    return settings


def test_over_the_request_limit_is_a_429_with_retry_after_and_openai_json(auth):
    with stack({"v1": [Behaviour("a")]}, client_key=KEY, **auth({"requests": 3, "window_s": 30})) as s:
        assert [s.chat(max_tokens=4).status_code for _ in range(3)] == [200, 200, 200]
        r = s.chat(max_tokens=4)
        assert r.status_code == 429
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("requests", "rate_limit_exceeded")
        assert "team-a" in err["message"] and KEY not in err["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 34  # up to a window and a bucket (decision.py)
        assert s.chat(max_tokens=4, key=OTHER).status_code == 200  # another key is not limited by it
        assert s.fakes["a"].requests == 4  # the refused one never reached an instance


def test_max_concurrent_refuses_the_one_too_many_and_frees_the_slot_after(auth):
    gate = threading.Event()
    with stack({"v1": [Behaviour("a", first_token_gate=gate)]}, client_key=KEY,
               **auth({"max_concurrent": 1})) as s:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(lambda: s.chat(stream=True, max_tokens=4))
            wait_until(lambda: s.fakes["a"].running == 1, what="the first request running")
            second = s.chat(stream=True, max_tokens=4)
            assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded"
            gate.set()
            assert first.result().status_code == 200
        wait_until(lambda: s.chat(max_tokens=4).status_code == 200, what="the hold released")


def test_a_token_budget_is_never_exceeded_by_more_than_one_request(auth):
    # the fake answers 1 prompt token and 4 completion tokens a request
    budget = 50
    with stack({"v1": [Behaviour("a", tokens=4)]}, client_key=KEY,
               **auth({"budget": {"tokens": budget, "period": "day"}})) as s:
        used, answers = 0, []
        for _ in range(40):
            r = s.chat("hi", max_tokens=4)
            answers.append(r.status_code)
            if r.status_code != 200:
                break
            used += r.json()["usage"]["total_tokens"]
        assert answers[-1] == 429 and answers.count(200) >= 3
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("insufficient_quota", "insufficient_quota")
        assert int(r.headers["retry-after"]) >= 1
        assert used <= budget + 5
        usage = s.admin("GET", "/keys/team-a/usage").json()
        assert usage["limits"]["budget"]["used"] == used  # settled to the actual usage
        assert usage["this_replica"]["completion_tokens"] == 4 * answers.count(200)


def test_a_priced_budget_is_spent_at_the_models_prices(auth):
    with stack({"v1": [Behaviour("a", tokens=4)]}, client_key=KEY,
               model={"price_per_1k_prompt_tokens": 1000.0, "price_per_1k_completion_tokens": 2000.0},
               **auth({"budget": {"amount": 100.0, "period": "month"}})) as s:
        assert s.chat("hi", max_tokens=4).status_code == 200
        b = s.admin("GET", "/keys/team-a/usage").json()["limits"]["budget"]
        assert b["used"] == pytest.approx(1 * 1.0 + 4 * 2.0)  # 1 prompt + 4 completion tokens
        assert b["limit"] == 100.0 and b["period"] == "month"


def test_a_stream_is_stopped_with_an_insufficient_quota_event_when_its_budget_runs_out(auth):
    with stack({"v1": [Behaviour("a", tokens=200)]}, client_key=KEY,
               **auth({"budget": {"tokens": 60, "period": "day"}, "stream_charge_tokens": 8})) as s:
        r = s.chat("hi", stream=True, max_tokens=200)
        assert r.status_code == 200
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "insufficient_quota" and "stopped after" in err["message"]
        tokens = [e for e in events[:-2] if json.loads(e)["choices"][0]["delta"].get("content")]
        assert 8 <= len(tokens) <= 60  # charged as it ran: it never got past the budget
        for _ in range(10):  # the next streams get what is left, then none
            if s.chat("hi", stream=True, max_tokens=200).status_code == 429:
                break
        else:
            raise AssertionError("the budget never refused a stream")
        wait_until(lambda: s.fakes["a"].running == 0, what="the upstream streams closed")
        used = s.admin("GET", "/keys/team-a/usage").json()["limits"]["budget"]["used"]
        assert 40 <= used <= 60  # settled: within the budget, less at most one batch of 8


def test_a_long_stream_within_its_budget_is_whole(auth):
    with stack({"v1": [Behaviour("a", tokens=50)]}, client_key=KEY,
               **auth({"budget": {"tokens": 1000, "period": "day"}, "stream_charge_tokens": 8})) as s:
        events = sse_events(s.chat("hi", stream=True).text)
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events)
        assert len(events) == 52  # 50 tokens, the finish chunk, [DONE]
        used = s.admin("GET", "/keys/team-a/usage").json()["limits"]["budget"]["used"]
        assert 50 <= used <= 50 + 20  # its completion plus the estimated prompt


def test_usage_is_by_name_behind_the_admin_key_and_no_secret_is_in_the_metrics(auth):
    with stack({"v1": [Behaviour("a")]}, client_key=KEY, **auth({"requests": 2, "window_s": 30})) as s:
        s.chat(max_tokens=4), s.chat(max_tokens=4), s.chat(max_tokens=4)
        s.chat(max_tokens=4, key=OTHER)
        assert s.client.get("/admin/keys/team-a/usage").status_code == 401
        assert s.admin("GET", "/keys/nobody/usage").status_code == 404
        u = s.admin("GET", "/keys/team-a/usage").json()
        assert u["limits"]["requests"] == {"used": 2, "limit": 2, "window_s": 30.0}
        assert u["this_replica"]["requests"] == 2 and u["this_replica"]["refused"] == 1
        assert s.admin("GET", "/keys/team-b/usage").json()["this_replica"]["requests"] == 1
        metrics = s.client.get("/metrics").text
        assert 'llmserve:gateway_key_requests_total{key="team-a",outcome="admitted"} 2.0' in metrics
        assert 'llmserve:gateway_key_requests_total{key="team-a",outcome="requests"} 1.0' in metrics
        assert 'llmserve:gateway_key_tokens_total{key="team-a",kind="completion"} 8.0' in metrics
        assert KEY not in metrics and OTHER not in metrics
        assert s.client.get("/ready").json()["limits"] == {"store": "memory", "degraded": False}


def test_unnamed_keys_and_keys_without_limits_are_never_refused(auth):
    with stack({"v1": [Behaviour("a")]}, client_key="plain-key-0123",
               **auth({"requests": 1, "window_s": 30}, unnamed=True)) as s:
        assert all(s.chat(max_tokens=2).status_code == 200 for _ in range(4))
        assert all(s.chat(max_tokens=2, key=OTHER).status_code == 200 for _ in range(4))


@pytest.mark.parametrize("keys, match", [
    ([{"key": KEY, "limits": {"requests": 1}}], "needs a name"),
    ([{"key": KEY, "name": "x"}, {"key": OTHER, "name": "x"}], "unique"),
    ([{"key": KEY, "name": "bad name"}], "key name"),
    ([{"key": KEY, "name": "x", "limits": {"requests": 0}}], "greater than or equal"),
])
def test_bad_key_config_is_refused(keys, match):
    with pytest.raises(ValidationError, match=match):
        GatewayConfig.model_validate({"auth": {"keys": keys}, "models": [
            {"name": "m", "versions": [{"name": "v", "weight": 1, "upstreams": []}]}]})


def test_a_client_that_leaves_mid_stream_frees_its_slot_and_pays_for_what_it_got(auth):
    with stack({"v1": [Behaviour("a", tokens=400, token_delay_s=0.01)]}, client_key=KEY,
               **auth({"max_concurrent": 1, "budget": {"tokens": 100_000, "period": "day"}})) as s:
        with s.client.stream("POST", "/v1/chat/completions", json={
                "model": "chat", "stream": True, "max_tokens": 400,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status_code == 200
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data: ")
                if got >= 5:
                    break  # and leave
        wait_until(lambda: s.fakes["a"].running == 0, what="the upstream stream closed")
        wait_until(lambda: s.admin("GET", "/keys/team-a/usage").json()["limits"]["concurrent"]["used"] == 0,
                   what="the hold released")
        spent = s.admin("GET", "/keys/team-a/usage").json()["limits"]["budget"]["used"]
        assert 5 + 8 <= spent < 400  # what was relayed (and the prompt's estimate), not the whole reservation
        assert s.chat(max_tokens=4).status_code == 200  # the slot is free again


def test_openai_rate_limit_headers_on_every_answer_and_on_the_429(auth):
    """x-ratelimit-{limit,remaining,reset}-{requests,tokens}, as OpenAI (and LiteLLM) send them:
    clients pace themselves by them before they ever get a 429."""
    limits = {"requests_per_minute": 3, "tokens_per_minute": 1000}
    with stack({"v1": [Behaviour("a")]}, client_key=KEY, **auth(limits)) as s:
        got = []
        for stream in (False, True, False):
            r = s.chat("hello", max_tokens=4, stream=stream)
            assert r.status_code == 200
            got.append(r.headers)
        assert [h["x-ratelimit-remaining-requests"] for h in got] == ["2", "1", "0"]
        assert all(h["x-ratelimit-limit-requests"] == "3" and h["x-ratelimit-limit-tokens"] == "1000" for h in got)
        # the estimate is reserved at admission (keys.md): "hello" // 3 + 8 prompt, 4 completion
        assert int(got[0]["x-ratelimit-remaining-tokens"]) == 1000 - 13
        # the window is whole again once this request's bucket left it: 60 to 66 s (a tenth more)
        assert all(h["x-ratelimit-reset-requests"] in {f"1m{i}s" for i in range(7)} for h in got), got
        r = s.chat("hello", max_tokens=4)
        assert r.status_code == 429 and r.headers["x-ratelimit-remaining-requests"] == "0"
        assert r.headers["x-ratelimit-limit-requests"] == "3" and int(r.headers["retry-after"]) >= 1
        assert "x-ratelimit-limit-requests" not in s.chat("hello", max_tokens=4, key=OTHER).headers


def test_the_rate_limit_headers_durations_are_written_as_openai_writes_them():
    from llmserve.gateway.tenants.decision import duration

    assert [duration(s) for s in (0.0171, 0.9991, 1, 59.2, 60, 360, 3725)] == [
        "18ms", "1000ms", "1s", "1m0s", "1m0s", "6m0s", "62m5s"]
