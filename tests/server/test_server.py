"""A real ``llmserve engine`` subprocess, spoken to with the official openai client and raw HTTP."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=256)


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    ep = start_engine(tiny_path, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny", "tiny-alias",
                      "--max-n", "4", "--max-body-bytes", "20000")
    yield ep
    ep.stop()


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def metric(server, name: str, labels: str = "") -> float:
    text = httpx.get(server.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (not labels or labels in line) and not line.startswith("#"):
            head, _, val = line.rpartition(" ")
            if head.split("{")[0] == name:
                total += float(val)
    return total


def test_models_and_completion(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny", "tiny-alias"]
    assert (models[0].family, models[0].context_length) == ("llama", 256)
    assert models[0].root and models[0].root == models[1].root  # the model both names serve (vLLM's field)
    r = client.completions.create(model="tiny", prompt="hello world", max_tokens=7, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_models_retrieve_as_openai_answers_it(client, server):
    """client.models.retrieve: GET /v1/models/{model}, each served name; another is a 404 naming it."""
    listed = {m.id: m for m in client.models.list().data}
    for name in ("tiny", "tiny-alias"):
        m = client.models.retrieve(name)
        assert (m.id, m.object, m.owned_by, m.context_length) == (name, "model", "llmserve", 256)
        assert m.root == listed[name].root
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("org/not-served")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    assert "org/not-served" in e.value.body["message"]


def test_stream_matches_non_stream_and_usage_chunk(client, server):
    kw = dict(model="tiny", prompt="abc def", max_tokens=12, temperature=0, ignore_eos=True)
    full = client.completions.create(**{k: v for k, v in kw.items() if k != "ignore_eos"},
                                     extra_body={"ignore_eos": True}).choices[0].text
    body = {**kw, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == full
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    # vLLM's continuous_usage_stats: the usage so far in every chunk
    body["stream_options"]["continuous_usage_stats"] = True
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as resp:
        each = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    made = [c["usage"]["completion_tokens"] for c in each]
    assert all(c["usage"]["prompt_tokens"] == usage["usage"]["prompt_tokens"] for c in each)
    assert made == sorted(made) and made[0] >= 1 and made[-1] == 12


def test_chat_stream_and_non_stream(client):
    msgs = [{"role": "user", "content": "hi there"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    text = r.choices[0].message.content
    parts = []
    for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                                stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts) == text
    assert r.usage.completion_tokens <= 8


def test_stop_string_and_n_and_seed(client):
    base = client.completions.create(model="tiny", prompt="one two", max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 4
    stop = base[2:4]
    r = client.completions.create(model="tiny", prompt="one two", max_tokens=16, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]
    seeded = dict(model="tiny", prompt="x", max_tokens=10, temperature=1.0, seed=7, n=3,
                  extra_body={"ignore_eos": True})
    a = client.completions.create(**seeded)
    b = client.completions.create(**seeded)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert len({c.text for c in a.choices}) > 1  # one seed, but n independent samples
    assert a.usage.completion_tokens == 3 * 10


def test_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) >= 1 and len(content[0].top_logprobs) == 2
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "n": 9}, 400, "n"),
    ({"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x " * 300, "max_tokens": 5}, 400, "prompt"),
    ({"prompt": "x", "model": "nope"}, 404, "model"),
    ({"prompt": "x", "priority": "urgent"}, 400, "priority"),
    ({"prompt": "x", "priority": -1000000000}, 400, "priority"),  # outside the default [0, 1]
    ({"prompt": "x", "priority": 2}, 400, "priority"),
    ({"prompt": "x", "priority": 10 ** 4000}, 400, "priority"),
    ({"max_tokens": 3}, 400, "prompt"),
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["param"] == param


def test_priorities_out_of_range_or_too_long_are_400s(server):
    huge = "1" * 5000
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "x", "priority": %s}' % huge.encode(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and "digits" in r.json()["error"]["message"]
    for header in (huge, "-1000000000", "-1", "urgent"):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x"}, headers={"x-priority": header})
        assert r.status_code == 400, (header[:20], r.text)
        assert r.json()["error"]["param"] == "priority"
    for ok in ("batch", "1", "0", "REALTIME"):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                       headers={"x-priority": ok}, timeout=30)
        assert r.status_code == 200, (ok, r.text)


def test_context_length_message_and_malformed_json_and_body_limit(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x " * 300, "max_tokens": 5})
    assert "maximum context length is 256" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 30000})
    assert r.status_code == 413 and "error" in r.json()
    # the engine keeps serving after all of that
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "fine", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200


def test_tokenize_detokenize(server):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "hello"}).json()["tokens"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["prompt"].endswith("hello")
    assert httpx.post(server.url + "/detokenize", json={"tokens": [10**9]}).status_code == 400
    # a chat with tools counts the prompt the chat would send, tools included (vLLM's tokenize takes them)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    plain = httpx.post(server.url + "/tokenize", json=chat).json()["count"]
    with_tools = httpx.post(server.url + "/tokenize", json={**chat, "tools": [tool]})
    assert with_tools.status_code == 200 and with_tools.json()["count"] > plain
    refused = httpx.post(server.url + "/tokenize", json={**chat, "chat_template_kwargs": {"bos_token": "x"}})
    assert refused.status_code == 400 and "may not set bos_token" in refused.json()["error"]["message"]


def test_disconnect_aborts_and_frees_kv(tmp_path):
    # Its own engine with a long context: 4,000 tokens take seconds, so the request is
    # still running when the client leaves, however slow the machine (200 could finish first).
    model = make_tiny_llama(tmp_path / "model", max_position_embeddings=4096)
    server = start_engine(model, tmp_path, "--served-model-name", "tiny")
    try:
        _disconnect_aborts_and_frees_kv(server)
    finally:
        server.stop()


def _disconnect_aborts_and_frees_kv(server):
    aborted = metric(server, "vllm:request_success_total", 'finished_reason="abort"')
    body = {"prompt": "go", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as resp:
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 3:
                assert metric(server, "vllm:kv_cache_usage_perc") > 0
                break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric(server, "vllm:kv_cache_usage_perc") > 0:
        time.sleep(0.05)
    assert metric(server, "vllm:kv_cache_usage_perc") == 0
    assert metric(server, "vllm:request_success_total", 'finished_reason="abort"') == aborted + 1


def test_metrics_and_load_names(server):
    text = httpx.get(server.url + "/metrics").text
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                 "llmserve:busy_fraction"]:
        assert name in text, name
    load = httpx.get(server.url + "/load").json()
    assert load["ready"] is True and load["model"] == "tiny" and 0 <= load["busy_fraction"] <= 1
    assert load["state"] == "ready"  # the shared lifecycle word (llmserve/lifecycle.py)


def test_api_key_overload_and_ready_before_warmup(tiny_path, tmp_path):
    ep = start_engine(tiny_path, tmp_path, "--api-key", "sekret", "--max-queued-requests", "1",
                      "--fault-latency-ms", "1500", "--startup-delay", "2", wait=False)
    try:
        deadline = time.monotonic() + 60
        saw_not_ready = saw_starting = False
        while time.monotonic() < deadline:
            try:
                r = httpx.get(ep.url + "/ready", timeout=1)
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if r.status_code == 503:
                saw_not_ready = True
                assert r.json()["state"] in ("starting", "warming")  # "loading" before the shared enum
                assert httpx.get(ep.url + "/health").status_code == 200
                if r.json()["state"] == "starting":  # no name known yet: not ready, not "does not exist"
                    saw_starting = True
                    m = httpx.get(ep.url + "/v1/models/tiny", headers={"Authorization": "Bearer sekret"})
                    if m.status_code != 503:  # (unless it got past starting in between)
                        assert httpx.get(ep.url + "/ready").json()["state"] != "starting", m.text
                    else:
                        assert m.headers.get("retry-after") == "1"
            if r.status_code == 200:
                break
            time.sleep(0.05)
        assert saw_not_ready and saw_starting
        ep.wait_ready()
        assert httpx.post(ep.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
        bad = httpx.post(ep.url + "/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        auth = {"Authorization": "Bearer sekret"}
        first: dict = {}
        t = threading.Thread(target=lambda: first.update(r=httpx.post(
            ep.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=auth, timeout=30)))
        t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        over = httpx.post(ep.url + "/v1/completions", json={"prompt": "y", "max_tokens": 2}, headers=auth)
        assert over.status_code == 503 and over.headers.get("retry-after")
        assert time.monotonic() - t0 < 1.0  # answered at once, not after the queue
        t.join()
        assert first["r"].status_code == 200
    finally:
        ep.stop()


def test_sigterm_drains_in_flight_streams(tiny_path, tmp_path):
    # the added latency keeps the request in flight long enough to signal during it
    ep = start_engine(tiny_path, tmp_path, "--fault-latency-ms", "1500")
    body = {"prompt": "go", "max_tokens": 120, "ignore_eos": True, "stream": True}
    result: dict = {}

    def stream():
        with httpx.stream("POST", ep.url + "/v1/completions", json=body, timeout=60) as resp:
            result["events"] = [line for line in resp.iter_lines() if line.startswith("data: ")]

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.5)
    ep.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert ep.proc.poll() is None
    ready = httpx.get(ep.url + "/ready")
    assert ready.status_code == 503 and ready.json()["state"] == "draining"
    assert httpx.get(ep.url + "/load").json()["state"] == "draining"
    assert httpx.post(ep.url + "/v1/completions", json={"prompt": "x"}).status_code == 503
    t.join(timeout=60)
    assert ep.proc.wait(timeout=30) == 0
    assert result["events"][-1] == "data: [DONE]"
    last = json.loads(result["events"][-2][6:])
    assert last["choices"][0]["finish_reason"] == "length"
