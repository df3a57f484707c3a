"""One bad client never hurts the others (issue 17), against a real ``llmserve engine``:
a client that leaves a non-streaming request, one that stops reading its stream, and
ones that are too slow or too big for the HTTP limits. Each wait is bounded; what is
checked is the engine's own state (``/load``, the abort counter), not timing."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.bad_clients import SLACK_S, connect, dribble_body, dribble_heads, exchange, post, status, wait_for
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine
from tests.server.test_server import metric

TIMEOUT_S = 1.0  # the header and body timeouts the instance runs with here
# Long, so that only the stream buffer can stop an unread stream (the guard's own
# tests check the send timeout).
SEND_TIMEOUT_S = 60.0
MAX_CONNECTIONS = 8
N = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=2048)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny",
                      "--max-n", str(N), "--header-timeout", str(TIMEOUT_S), "--body-timeout", str(TIMEOUT_S),
                      "--send-timeout", str(SEND_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS),
                      "--stream-buffer-outputs", "16")
    yield ep
    ep.stop()


def aborted(server) -> float:
    return metric(server, "vllm:request_success_total", 'finished_reason="abort"')


def running(server) -> int:
    return httpx.get(server.url + "/load").json()["num_running"]


def test_a_non_streaming_request_is_aborted_when_its_client_leaves(server):
    before = aborted(server)
    s = connect(server.port)
    s.sendall(post("/v1/completions", {"prompt": "go", "max_tokens": 2000, "ignore_eos": True}))
    wait_for(lambda: running(server) == 1, 30, "the request to run")
    s.close()
    wait_for(lambda: running(server) == 0, 5, "the request to stop")
    assert aborted(server) == before + 1  # stopped, not finished
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "ignore_eos": True},
                   timeout=30)  # ignore_eos: sampled at the default temperature, EOS could come first
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_stream_nobody_reads_is_aborted_and_ends_with_an_error_event(server):
    """Big events (n choices, 20 logprobs each) fill the socket buffers in a few MB; then
    the instance's per-request buffer (16 outputs per choice) overflows and it aborts,
    while the client still has not read a byte. When it reads at last, the stream ends
    with an error event instead of [DONE]."""
    before = aborted(server)
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 1900, "ignore_eos": True, "n": N,
            "stream": True, "logprobs": True, "top_logprobs": 20}
    with connect(server.port, rcvbuf=4096) as s:
        s.sendall(post("/v1/chat/completions", body))
        wait_for(lambda: aborted(server) == before + N, 120, "the unread stream's sequences to be aborted")
        assert running(server) == 0
        assert metric(server, "vllm:generation_tokens_total") < N * 1900  # cut well before the whole answer
        s.settimeout(30)
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
            chunk = s.recv(1 << 20)
            assert chunk, "the connection closed before the stream ended"
            received += chunk
    tail = received[-2000:]
    assert b"client_too_slow" in tail and b"[DONE]" not in tail


def test_oversized_headers_and_urls_are_refused(server):
    resp = exchange(server.port, post("/v1/completions", {"prompt": "hi"}, headers=b"x-big: " + b"a" * 40_000 + b"\r\n"))
    assert status(resp) == 431
    assert status(exchange(server.port, b"GET /health?" + b"q" * 20_000 + b" HTTP/1.1\r\nhost: t\r\n\r\n")) == 414


def test_slowloris_and_slow_bodies_are_cut_at_their_timeouts(server):
    ended = dribble_heads(server.port, 3, give_up_s=TIMEOUT_S + SLACK_S)
    assert [status(a) for _, a in ended] == [408] * 3
    resp = dribble_body(server.port, "/v1/completions", give_up_s=TIMEOUT_S + SLACK_S)
    assert status(resp) == 408


def test_over_the_connection_cap_requests_get_503(server):
    idle = [connect(server.port) for _ in range(MAX_CONNECTIONS)]
    try:
        t0 = time.monotonic()
        assert status(exchange(server.port, b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")) == 503
        assert time.monotonic() - t0 < TIMEOUT_S  # answered, not closed by a timeout
    finally:
        for s in idle:
            s.close()
    wait_for(lambda: httpx.get(server.url + "/health").status_code == 200, SLACK_S, "a 200 below the cap")
