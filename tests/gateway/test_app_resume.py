"""Mid-stream resume against fake upstreams: what the gateway asks of which instance,
and the explicit error where a stream cannot be resumed (the live resume of real
engines is in test_gateway_resume.py)."""

import json

from prometheus_client.parser import text_string_to_metric_families

from .app_harness import sse_events, stack
from .fake_upstream import Behaviour

CHAT = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def resumes(s) -> dict[str, float]:
    """``stream_resumes_total`` by outcome."""
    return {x.labels["outcome"]: x.value for f in text_string_to_metric_families(s.client.get("/metrics").text)
            for x in f.samples if x.name == "llmserve:gateway_stream_resumes_total"}


def _stream(s, body: dict) -> list[str]:
    with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return sse_events(r.read().decode())


def test_a_stream_broken_mid_way_goes_on_on_another_instance_from_where_the_client_is():
    a, b = (Behaviour(n, tokens=8, break_after_tokens=3) for n in "ab")  # (a resumed one does not break)
    with stack({"v1": [a, b]}) as s:
        events = _stream(s, CHAT)
        assert events[-1] == "[DONE]"
        texts = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
        assert "".join(t or "" for t in texts) == "".join(f"t{i} " for i in range(8))
        assert not any("token_ids" in e for e in events)  # the gateway's, not the client's
        first, second = (a, b) if a.bodies and "resume_token_ids" not in a.bodies[0] else (b, a)
        assert first.bodies[0]["return_token_ids"] is True
        assert second.bodies[0]["resume_token_ids"] == [0, 1, 2]
        assert {k: v for k, v in second.bodies[0].items() if k != "resume_token_ids"} == first.bodies[0]
        assert resumes(s) == {"resumed": 1}


def test_tokens_in_the_same_buffer_as_an_engine_dead_event_reach_the_client_before_the_resume():
    """Their ids count as the client's, so the resumed instance starts after them: were
    their text dropped, the client's stream would have a gap."""
    a, b = (Behaviour(n, tokens=8, dead_after_tokens=3) for n in "ab")
    with stack({"v1": [a, b]}) as s:
        events = _stream(s, CHAT)
        assert events[-1] == "[DONE]" and not any("engine_dead" in e for e in events)
        texts = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
        assert "".join(t or "" for t in texts) == "".join(f"t{i} " for i in range(8))
        resumed = next(x for x in (a, b) if x.bodies and "resume_token_ids" in x.bodies[-1])
        assert resumed.bodies[-1]["resume_token_ids"] == [0, 1, 2]
        assert resumes(s) == {"resumed": 1}


def test_a_foreign_instance_gets_no_engine_fields_and_a_stream_it_breaks_says_why_it_is_not_resumed():
    with stack({"v1": [Behaviour("vllm", tokens=6, break_after_tokens=2, has_load=False)]}) as s:
        events = _stream(s, CHAT)
        assert all("return_token_ids" not in b for b in s.fakes["vllm"].bodies)
        error = json.loads(events[-1])["error"]
        assert error["code"] == "upstream_broken" and "could not be resumed" in error["message"]
        assert "is not an llmserve engine" in error["message"]
        assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == ["t0 ", "t1 "]
        assert resumes(s) == {"not_resumable": 1}


def test_a_stream_no_instance_can_continue_ends_with_an_error_event_and_counts_as_failed():
    a = Behaviour("a", tokens=6, break_after_tokens=2)
    with stack({"v1": [a]}) as s:
        a.bodies = _Refusing(a)
        error = json.loads(_stream(s, CHAT)[-1])["error"]
        assert "answered 400 to the continuation" in error["message"]
        assert resumes(s) == {"failed": 1}


class _Refusing(list):
    """A fake's request log that makes the fake refuse continuations (400)."""

    def __init__(self, b: Behaviour) -> None:
        super().__init__()
        self.b = b

    def append(self, body: dict) -> None:
        if "resume_token_ids" in body:
            self.b.error_rate, self.b.error_status = 1.0, 400
        super().append(body)


def test_a_stream_is_not_resumed_on_a_foreign_instance():
    engine = Behaviour("engine", tokens=6, break_after_tokens=2)
    foreign = Behaviour("vllm", tokens=6, break_after_tokens=2, has_load=False)
    with stack({"v1": [engine, foreign]}) as s:
        events = _stream(s, CHAT)
        assert all("resume_token_ids" not in b for f in (engine, foreign) for b in f.bodies)
        # whichever served it first: a foreign one cannot continue a stream, nor resume one
        assert "is not an llmserve engine" in json.loads(events[-1])["error"]["message"]


def test_an_engine_that_sends_no_token_ids_is_not_resumed_from_nothing():
    """Resuming without the ids would repeat the text the client has."""
    a, b = Behaviour("a", tokens=6, break_after_tokens=2), Behaviour("b", tokens=6, break_after_tokens=2)
    with stack({"v1": [a, b]}) as s:
        for f in (a, b):  # an engine that ignores return_token_ids
            f.bodies = _Forgetful()
        events = _stream(s, CHAT)
        assert all("resume_token_ids" not in body for f in (a, b) for body in f.bodies)
        error = json.loads(events[-1])["error"]
        assert "sent chunks without their token ids" in error["message"]


class _Forgetful(list):
    """A fake's request log that drops return_token_ids as the fake reads the body."""

    def append(self, body: dict) -> None:
        body.pop("return_token_ids", None)
        super().append(body)


def test_streams_that_cannot_be_resumed_are_not_asked_for_token_ids_and_say_why():
    a = Behaviour("a", tokens=6, break_after_tokens=2)
    with stack({"v1": [a]}) as s:
        events = _stream(s, {**CHAT, "n": 2})
        assert "return_token_ids" not in a.bodies[0]
        assert "n > 1" in json.loads(events[-1])["error"]["message"]


def test_resume_token_ids_is_refused_from_clients():
    a = Behaviour("a")
    with stack({"v1": [a]}) as s:
        r = s.client.post("/v1/chat/completions", json={**CHAT, "resume_token_ids": [1, 2]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "resume_token_ids"
        assert a.requests == 0


def test_resuming_off_keeps_the_plain_request_and_the_error_event():
    a = Behaviour("a", tokens=6, break_after_tokens=2)
    with stack({"v1": [a]}, retry={"max_resumes": 0}) as s:
        events = _stream(s, CHAT)
        assert a.bodies[0] == {**CHAT, "model": "chat"}
        assert "resuming is off" in json.loads(events[-1])["error"]["message"]
