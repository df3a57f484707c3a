"""Retries before the first byte, the breaker, mid-stream failure, recovery."""

import json
import threading

from .app_harness import instance_of, sse_events, stack, wait_until
from .fake_upstream import Behaviour, ServerThread, free_port, make_app

BREAKER = {"failure_threshold": 2, "cooloff_s": 0.3, "max_cooloff_s": 0.6,
           "probe_timeout_s": 5}


def test_5xx_is_retried_on_another_instance_and_breaker_opens():
    bad, good = Behaviour("bad", error_rate=1.0, error_status=503), Behaviour("good")
    # prefix/load scores would not separate two idle instances: they alternate by P2C
    with stack({"v1": [bad, good]}, breaker={**BREAKER, "cooloff_s": 30}) as s:
        results = [s.chat(f"q{i}") for i in range(12)]
        assert all(r.status_code == 200 for r in results)
        assert all(instance_of(r) == s.gateway.pool("chat", "v1").instances()[1].instance_id
                   for r in results)
        assert bad.requests == 2  # then its breaker opened
        text = s.client.get("/metrics").text
        assert "llmserve:gateway_retries_total" in text
        pools = s.admin("GET", "/pools").json()["pools"]
        states = {i["instance_id"]: i["breaker"] for i in pools[0]["instances"]}
        assert sorted(states.values()) == ["closed", "open"]


def test_a_request_the_engine_failed_alone_is_not_retried_nor_held_against_the_instance():
    """A poison request fails on every instance: retrying spreads it and trips breakers."""
    a = Behaviour("a", error_rate=1.0, error_code="request_failed")
    b = Behaviour("b", error_rate=1.0, error_code="request_failed")
    with stack({"v1": [a, b]}, breaker={**BREAKER, "cooloff_s": 30}) as s:
        for i in range(6):
            r = s.chat(f"q{i}")
            assert r.status_code == 500 and r.json()["error"]["code"] == "request_failed"
        assert a.requests + b.requests == 6  # one attempt each
        pools = s.admin("GET", "/pools").json()["pools"]
        assert {i["breaker"] for i in pools[0]["instances"]} == {"closed"}


def test_all_attempts_failing_returns_the_upstream_error():
    with stack({"v1": [Behaviour("a", error_rate=1.0), Behaviour("b", error_rate=1.0)]},
               breaker={"failure_threshold": 100}) as s:
        r = s.chat()
        assert r.status_code == 500
        assert "injected fault" in r.json()["error"]["message"]
        assert s.fakes["a"].requests + s.fakes["b"].requests == 3  # max_attempts


def test_dead_instance_is_retried_elsewhere_then_returns_when_back():
    port = free_port()
    with stack({"v1": [Behaviour("live", tokens=2)]}, dead={"v1": port},
               breaker=BREAKER, wait_ready=False) as s:
        pool = s.gateway.pool("chat", "v1")
        wait_until(lambda: any(i.ready for i in pool.instances()), what="live instance")
        dead_id = f"127.0.0.1:{port}"
        # even if the dead one were tried first, the client never sees its failure
        for i in range(10):
            r = s.chat(f"q{i}")
            assert r.status_code == 200 and instance_of(r) != dead_id
        revived = Behaviour("revived", tokens=2)
        srv = ServerThread(make_app(revived), port=port).start()
        try:
            wait_until(lambda: pool.get(dead_id).ready, what="revived instance ready")
            for i in range(30):
                s.chat(f"again{i}")
            assert revived.requests > 0
        finally:
            srv.stop(force=True)


def test_instance_killed_mid_load_requests_retry_and_succeed():
    a, b = Behaviour("a", tokens=3, token_delay_s=0.01), Behaviour("b", tokens=3)
    with stack({"v1": [a, b]}, breaker=BREAKER) as s:
        for i in range(4):
            assert s.chat(f"warm{i}").status_code == 200
        s.upstreams["a"].stop(force=True)  # connection refused from now on
        results = [s.chat(f"after{i}") for i in range(10)]
        assert all(r.status_code == 200 for r in results), [r.text for r in results]
        a_id = s.gateway.pool("chat", "v1").instances()[0].instance_id
        assert all(instance_of(r) != a_id for r in results)


def test_a_refused_connection_marks_the_instance_not_ready_before_the_monitor_polls():
    """The request that finds an instance dead takes it out of rotation at once (the monitor,
    polling once a minute here, would have been the one to): the next requests do not try it."""
    a, b = Behaviour("a", tokens=3), Behaviour("b", tokens=3)
    with stack({"v1": [a, b]}, breaker={"failure_threshold": 100},
               polling={"load_interval_s": 60.0, "ready_interval_s": 60.0}) as s:
        pool = s.gateway.pool("chat", "v1")
        a_id = pool.instances()[0].instance_id
        s.upstreams["a"].stop(force=True)  # connection refused from now on
        results = [s.chat(f"after{i}") for i in range(8)]
        assert all(r.status_code == 200 and instance_of(r) != a_id for r in results), [r.text for r in results]
        assert not pool.get(a_id).ready and a.requests == 0


def test_an_upstream_answer_that_is_not_openai_json_reaches_the_client_as_openai_json():
    """A plain-text 500 is passed on in OpenAI's error shape, what it said kept; a 200 whose body
    is no JSON object (HTML, a cut body) is an upstream failure: retried, then a 502."""
    cases = [((500, "text/plain", "Internal Server Error"), 500, "Internal Server Error"),
             ((200, "text/html", "<html>oops</html>"), 502, "no JSON object"),
             ((200, "application/json", '{"id": "x", "choices": ['), 502, "no JSON object")]
    for raw, status, says in cases:
        bad = Behaviour("bad", raw_answer=raw)
        with stack({"v1": [bad]}, breaker={"failure_threshold": 100}) as s:
            for stream in (False, True):
                r = s.chat("hi", stream=stream)
                assert r.status_code == status, (raw, stream, r.text)
                err = r.json()["error"]
                assert says in err["message"] and err["type"].endswith("_error") and err["code"], (raw, err)


def test_stream_broken_mid_way_ends_with_an_error_event_not_silence():
    # Not resumed (resuming is in test_app_resume.py): a resume would succeed on "a" itself.
    with stack({"v1": [Behaviour("a", tokens=6, break_after_tokens=2)]}, retry={"max_resumes": 0}) as s:
        with s.client.stream("POST", "/v1/chat/completions", json={
                "model": "chat", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status_code == 200
            text = r.read().decode()
        events = sse_events(text)
        assert "[DONE]" not in events
        contents = [json.loads(e) for e in events]
        assert [c["choices"][0]["delta"]["content"] for c in contents[:2]] == ["t0 ", "t1 "]
        assert contents[-1]["error"]["code"] == "upstream_broken"
        assert "incomplete" in contents[-1]["error"]["message"]
        text = s.client.get("/metrics").text
        assert 'kind="stream_broken"' in text


def test_stream_that_breaks_before_its_first_event_is_retried():
    broken, fine = Behaviour("broken", break_after_tokens=0), Behaviour("fine", tokens=2)
    with stack({"v1": [broken, fine]}, breaker={"failure_threshold": 100}) as s:
        for _ in range(30):
            if broken.requests >= 2:
                break
            with s.client.stream("POST", "/v1/chat/completions", json={
                    "model": "chat", "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}) as r:
                events = sse_events(r.read().decode())
            assert events[-1] == "[DONE]"
        assert broken.requests >= 2  # it was tried, and the client never saw it


def test_a_retried_stream_that_still_fails_ends_with_an_error_event():
    # The head went out with the first upstream's; the retries broke before their
    # first event as well, so the failure can only be told in the stream.
    a, b = Behaviour("a", break_after_tokens=0), Behaviour("b", break_after_tokens=0)
    with stack({"v1": [a, b]}, breaker={"failure_threshold": 100}) as s:
        with s.client.stream("POST", "/v1/chat/completions", json={
                "model": "chat", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status_code == 200
            events = sse_events(r.read().decode())
        assert a.requests + b.requests == 3  # max_attempts
        assert len(events) == 1
        error = json.loads(events[0])["error"]
        assert error["code"] == "upstream_broken" and "3 attempts failed" in error["message"]


def test_stream_head_reaches_the_client_before_the_first_event():
    # A client that got the head only with the first token would set up its
    # response inside the time to first token.
    gate = threading.Event()
    release = threading.Timer(10, gate.set)  # a gateway holding the head fails, not hangs
    release.start()
    a = Behaviour("a", tokens=2, first_token_gate=gate)
    try:
        with stack({"v1": [a]}) as s:
            with s.client.stream("POST", "/v1/chat/completions", json={
                    "model": "chat", "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}) as r:
                assert r.status_code == 200 and not gate.is_set()
                assert r.headers["content-type"].startswith("text/event-stream")
                gate.set()
                events = sse_events(r.read().decode())
            assert events[-1] == "[DONE]"
    finally:
        release.cancel()


def test_a_client_leaving_mid_stream_frees_the_slot_and_the_upstream():
    a = Behaviour("a", tokens=50, token_delay_s=0.05)
    with stack({"v1": [a]}) as s:
        with s.client.stream("POST", "/v1/chat/completions", json={
                "model": "chat", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            next(r.iter_raw())  # one event, then hang up
        inst = s.gateway.pool("chat", "v1").instances()[0]
        wait_until(lambda: inst.inflight == 0, what="slot freed")
        wait_until(lambda: a.running == 0, what="upstream stream closed")
        assert 'status="499"' in s.client.get("/metrics").text
