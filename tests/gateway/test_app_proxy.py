"""The gateway app end to end over loopback: proxying, streaming, errors, auth, limits."""

import json

import httpx

from .app_harness import CLIENT_KEY, OPS_KEY, PRIVILEGED_AUTH, instance_of, sse_events, stack
from .fake_upstream import Behaviour


def test_non_streaming_and_streaming_pass_through():
    with stack({"v1": [Behaviour("a", tokens=3)]}) as s:
        r = s.chat("hi", max_tokens=3)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "t0 t1 t2"
        assert r.headers["x-llmserve-version"] == "v1"
        assert instance_of(r) == s.gateway.pool("chat", "v1").instances()[0].instance_id

        with s.client.stream("POST", "/v1/chat/completions", json={
                "model": "chat", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            text = r.read().decode()
        events = sse_events(text)
        assert events[-1] == "[DONE]"
        deltas = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
        assert deltas == ["t0 ", "t1 ", "t2 ", None]
        # the upstream got the request id and version
        assert s.fakes["a"].headers[-1]["x-llmserve-version"] == "v1"
        assert s.fakes["a"].headers[-1]["x-request-id"]


def test_completions_endpoint_and_model_list():
    with stack({"v1": [Behaviour("a")]}) as s:
        r = s.client.post("/v1/completions", json={"model": "chat", "prompt": "once upon"})
        assert r.status_code == 200
        assert s.fakes["a"].bodies[-1]["prompt"] == "once upon"
        models = s.client.get("/v1/models").json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["chat"]


def test_upstream_model_rewrites_the_model_field():
    """The request's model becomes the upstream's name and the answers' name the client's
    again (a llama.cpp instance answers with its GGUF's path: no file path reaches clients)."""
    path = "/srv/models/x.Q4_1.gguf"
    with stack({"v1": [Behaviour("a")]}, version_extra={"v1": {"upstream_model": path}}) as s:
        r = s.chat(temperature=0.5)
        assert r.status_code == 200 and r.json()["model"] == "chat"
        assert s.fakes["a"].bodies[-1]["model"] == path
        assert s.fakes["a"].bodies[-1]["temperature"] == 0.5
        streamed = s.chat(stream=True).text
        assert '"model": "chat"' in streamed.replace('"model":"', '"model": "') and path not in streamed


def _assert_openai_error(r: httpx.Response, status: int, code: str | None = None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if code is not None:
        assert err["code"] == code
    return err


def test_client_errors_are_openai_shaped():
    with stack({"v1": [Behaviour("a")]}, auth=PRIVILEGED_AUTH, client_key=CLIENT_KEY) as s:
        _assert_openai_error(s.chat(model="nope"), 404, "model_not_found")
        r = s.client.post("/v1/chat/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
        _assert_openai_error(r, 400, "invalid_json")
        _assert_openai_error(s.client.post("/v1/chat/completions", json={"messages": []}),
                             400, "missing_model")
        _assert_openai_error(s.chat(headers={"x-llmserve-version": "v9"}, key=OPS_KEY), 400,
                             "unknown_version")
        _assert_openai_error(s.chat(priority="urgent"), 400, "invalid_priority")
        _assert_openai_error(s.client.get("/v1/nothing-here"), 404)
        assert s.fakes["a"].requests == 0


def test_api_keys_are_required_when_configured():
    auth = {"api_keys": ["client-key-one", "client-key-two"]}
    with stack({"v1": [Behaviour("a")]}, auth=auth) as s:
        _assert_openai_error(s.chat(), 401, "invalid_api_key")
        _assert_openai_error(s.chat(headers={"authorization": "Bearer client-key-oneX"}), 401)
        _assert_openai_error(s.client.get("/v1/models"), 401)
        assert s.chat(headers={"authorization": "Bearer client-key-two"}).status_code == 200
        assert s.client.get("/health").status_code == 200  # liveness needs no key


def test_body_and_header_limits():
    limits = {"max_body_bytes": 2048, "max_header_bytes": 4096}
    with stack({"v1": [Behaviour("a")]}, limits=limits) as s:
        _assert_openai_error(s.chat("x" * 4000), 413, "body_too_large")

        def chunked():
            yield json.dumps({"model": "chat", "prompt": "y" * 3000}).encode()
        r = s.client.post("/v1/completions", content=chunked(),
                          headers={"content-type": "application/json"})
        _assert_openai_error(r, 413, "body_too_large")
        _assert_openai_error(s.chat(headers={"x-big": "z" * 5000}), 431, "headers_too_large")
        assert s.fakes["a"].requests == 0
        assert s.chat("small").status_code == 200


def test_upstream_4xx_passes_through_without_retry():
    with stack({"v1": [Behaviour("a", error_rate=1.0, error_status=400),
                       Behaviour("b", error_rate=1.0, error_status=400)]}) as s:
        r = s.chat()
        assert r.status_code == 400 and "injected fault" in r.json()["error"]["message"]
        assert s.fakes["a"].requests + s.fakes["b"].requests == 1


def test_gateway_ready_and_metrics():
    with stack({"v1": [Behaviour("a")]}) as s:
        assert s.client.get("/ready").status_code == 200
        s.chat()
        text = s.client.get("/metrics").text
        assert 'llmserve:gateway_requests_total{class="realtime",model="chat",status="200",' \
               'version="v1"} 1.0' in text
        assert "llmserve:gateway_queue_depth" in text
        assert "llmserve:gateway_e2e_request_latency_seconds_bucket" in text
        assert 'llmserve:gateway_upstream_requests_total{instance=' in text


class _Recorder:
    def __init__(self):
        self.events = []

    def on_arrival(self, model, version, t, prompt_chars, batch=False):
        self.events.append(("arrival", model, version, prompt_chars))

    def on_first_token(self, model, version, t, ttft_s, batch=False):
        self.events.append(("first_token", model, version, ttft_s > 0))

    def on_finish(self, model, version, t, e2e_s, output_tokens, ok, batch=False):
        self.events.append(("finish", model, version, output_tokens, ok))


def test_observers_see_arrivals_first_tokens_and_finishes():
    with stack({"v1": [Behaviour("a", tokens=3)]}) as s:
        rec = _Recorder()
        s.gateway.observers.append(rec)
        assert s.chat("12345").status_code == 200
        with s.client.stream("POST", "/v1/completions", json={
                "model": "chat", "prompt": "abc", "stream": True}) as r:
            r.read()
        assert rec.events[:2] == [("arrival", "chat", "v1", 5), ("finish", "chat", "v1", 3, True)]
        assert rec.events[2:4] == [("arrival", "chat", "v1", 3), ("first_token", "chat", "v1", True)]
        kind, _, _, tokens, ok = rec.events[4]
        assert kind == "finish" and ok and tokens == 4  # 3 token events + the finish event


def test_prefix_affinity_text_starts_with_the_tools_the_instance_renders_first():
    from llmserve.gateway.request import prompt_text

    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "get_weather"}}]}]
    with_tools = prompt_text({"messages": msgs, "tools": tools}, 10_000)
    assert with_tools.startswith("<tools>") and "get_weather" in with_tools.split("<user>")[0]
    assert "c1" in with_tools.split("<assistant>")[1]
    assert not prompt_text({"messages": msgs, "tools": tools, "tool_choice": "none"}, 10_000).startswith("<tools>")
    assert len(prompt_text({"messages": msgs, "tools": tools * 100}, 50)) == 50
    # content parts as the instance joins them, so a string and its parts share a prefix
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "no"},
                                          {"type": "text", "text": "b"}]}]
    as_string = [{"role": "user", "content": "a\nb"}]
    assert prompt_text({"messages": parts}, 100) == prompt_text({"messages": as_string}, 100)
