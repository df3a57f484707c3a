"""The streaming client: chunk timings from a replayed stream with a fake clock, payloads,
and failures by kind against real (loopback) servers."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from llmserve.bench import metrics
from llmserve.bench.client import EndpointConfig, build_payload, send_request
from llmserve.bench.datasets import SampleRequest
from llmserve.bench.records import ErrorKind, OutputCountSource


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replay(events: list[tuple[float, str]], clock: FakeClock) -> httpx.AsyncClient:
    """A client whose server sends each SSE line once the fake clock reaches its time."""

    async def stream():
        for at, line in events:
            clock.now = 1000.0 + at
            yield line.encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stream(), headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def data(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


REQ = SampleRequest("hello world", prompt_len=2, output_len=5)
CFG = EndpointConfig(base_url="http://127.0.0.1:1/v1", model="m")


async def test_timings_from_a_hand_built_stream():
    clock = FakeClock()
    events = [
        (0.100, data({"choices": [{"index": 0, "text": "a"}]})),
        (0.150, ": keep-alive\n\n"),
        (0.160, data({"choices": [{"index": 0, "text": " b c"}]})),  # two tokens in one chunk
        (0.260, data({"choices": [{"index": 0, "text": " d"}]})),
        (0.300, data({"choices": [{"index": 0, "text": " e", "finish_reason": "length"}]})),
        (0.310, data({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})),
        (0.320, "data: [DONE]\n\n"),
    ]
    async with replay(events, clock) as client:
        rec = await send_request(client, CFG, REQ, 0, clock_origin=999.0, clock=clock)
    assert rec.success, rec.error
    assert rec.start_s == pytest.approx(1.0)
    assert rec.chunk_s == pytest.approx([0.100, 0.160, 0.260, 0.300])
    assert metrics.ttft(rec) == pytest.approx(0.100)
    assert metrics.itls(rec) == pytest.approx([0.060, 0.100, 0.040])
    assert metrics.e2el(rec) == pytest.approx(0.300)  # the usage event is not a token
    assert (rec.output_tokens, rec.output_source) == (5, OutputCountSource.USAGE)
    assert metrics.tpot(rec) == pytest.approx(0.200 / 4)
    assert (rec.usage_prompt_tokens, rec.generated_text) == (3, "a b c d e")


async def test_chat_deltas_and_missing_usage():
    clock = FakeClock()
    events = [
        (0.2, data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})),
        (0.3, data({"choices": [{"index": 0, "delta": {"content": "hi"}}]})),
        (0.5, data({"choices": [{"index": 0, "delta": {"content": " there"}}]})),
        (0.6, "data: [DONE]\n\n"),
    ]
    async with replay(events, clock) as client:
        cfg = EndpointConfig(base_url="http://127.0.0.1:1/v1", model="m", endpoint="chat")
        rec = await send_request(client, cfg, REQ, 0, clock_origin=1000.0, clock=clock)
    assert rec.success and rec.generated_text == "hi there"
    assert metrics.ttft(rec) == pytest.approx(0.2)  # vLLM times the first choice event
    assert (rec.output_tokens, rec.output_source) == (3, OutputCountSource.CHUNKS)


@pytest.mark.parametrize(
    "events, message",
    [
        ([(0.1, "data: [DONE]\n\n")], "no choice"),
        ([(0.1, data({"choices": [{"text": "a"}]}))], "without 'data: [DONE]'"),
        ([(0.1, "data: {not json\n\n")], "malformed"),
        ([(0.1, data({"choices": [{"text": "a"}]})), (0.2, data({"error": {"message": "oom"}}))], "error event"),
    ],
)
async def test_bad_streams_are_stream_failures(events, message):
    clock = FakeClock()
    async with replay(events, clock) as client:
        rec = await send_request(client, CFG, REQ, 0, clock_origin=1000.0, clock=clock)
    assert not rec.success and rec.error_kind is ErrorKind.STREAM and message in rec.error
    assert rec.failure_label == "stream"


def test_payloads():
    req = SampleRequest("p", 1, 7, messages=[{"role": "user", "content": "m"}], priority="batch")
    body = build_payload(req, EndpointConfig(base_url="http://127.0.0.1:8000", model="m", endpoint="chat",
                                                ignore_eos=True))
    assert body["messages"] == [{"role": "user", "content": "m"}] and "prompt" not in body
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["ignore_eos"], body["priority"]) == (7, True, "batch")
    body = build_payload(SampleRequest("p", 1, 7), CFG)
    assert body["prompt"] == "p" and "priority" not in body and "ignore_eos" not in body
    assert EndpointConfig(base_url="http://127.0.0.1:8000", model="m").url == "http://127.0.0.1:8000/v1/completions"
    assert EndpointConfig(base_url="http://h:1/v1/", model="m", endpoint="chat").url == "http://h:1/v1/chat/completions"
    for bad in ("127.0.0.1:8000", "ftp://h/v1"):
        with pytest.raises(ValueError):
            EndpointConfig(base_url=bad, model="m")


# --- failures against real loopback servers ------------------------------------------


async def _send(url: str, timeout_s: float = 5.0):
    cfg = EndpointConfig(base_url=url, model="fake-model", timeout_s=timeout_s)
    async with httpx.AsyncClient(trust_env=False) as client:
        return await send_request(client, cfg, REQ, 0, clock_origin=0.0)


async def test_http_status_failure(fake_server):
    rec = await _send(fake_server.url("/http500/v1"))
    assert (rec.success, rec.error_kind, rec.http_status) == (False, ErrorKind.HTTP_STATUS, 500)
    assert rec.failure_label == "http_500" and "boom" in rec.error


async def test_dropped_connection_is_a_connection_failure(fake_server):
    rec = await _send(fake_server.url("/drop/v1"))
    assert not rec.success and rec.error_kind is ErrorKind.CONNECTION, rec.error


async def test_refused_connection_is_a_connection_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        rec = await _send(f"http://127.0.0.1:{port}/v1")
    assert not rec.success and rec.error_kind is ErrorKind.CONNECTION


async def test_hanging_server_is_a_timeout(fake_server):
    rec = await _send(fake_server.url("/hang/v1"), timeout_s=0.3)
    assert not rec.success and rec.error_kind is ErrorKind.TIMEOUT and "0.3" in rec.error


async def test_stream_without_done_is_a_stream_failure(fake_server):
    rec = await _send(fake_server.url("/nodone/v1"))
    assert not rec.success and rec.error_kind is ErrorKind.STREAM


async def test_ok(fake_server):
    rec = await _send(fake_server.url("/ok/v1"))
    assert rec.success and rec.output_tokens == 3 and rec.usage_prompt_tokens == 2
    assert fake_server.stats.bodies[0]["stream_options"] == {"include_usage": True}
