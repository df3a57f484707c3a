"""One bad client never hurts the others (issue 17), through a real ``llmserve gateway``
in front of a real ``llmserve engine``: a client that leaves its non-streaming request
or stops reading its stream stops the generation at the instance (the gateway closes
its upstream connection); clients too slow or too big for the gateway's limits are
refused by the gateway itself; ``llmserve serve`` hosts the gateway behind the same
guard. Waits are bounded; the checks are the instance's own state."""

from __future__ import annotations

import argparse
import time

import httpx
import pytest
import uvicorn

from llmserve.gateway.config import LimitsConfig
from llmserve.http_guard import GuardedHttpToolsProtocol
from tests.bad_clients import (SLACK_S, connect, dribble_body, dribble_heads, exchange, post, status,
                               was_reset, wait_for)
from tests.gateway.test_gateway_engines import GatewayProcess, gateway_config
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine
from tests.server.test_server import metric

pytestmark = pytest.mark.slow

TIMEOUT_S = 1.0  # the gateway's header, body and send timeouts here
MAX_CONNECTIONS = 8
N = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=2048)
    engine = start_engine(model, logs, "--served-model-name", "tiny", "--max-n", str(N))
    config = gateway_config({"v1": [engine.url]})
    config["limits"] = {"header_timeout_s": TIMEOUT_S, "body_timeout_s": TIMEOUT_S, "send_timeout_s": TIMEOUT_S,
                        "max_connections": MAX_CONNECTIONS}
    gw = GatewayProcess(config, logs)
    try:
        gw.wait_all_ready()
        yield engine, gw
    finally:
        gw.stop()
        engine.stop()


def aborted(engine) -> float:
    return metric(engine, "vllm:request_success_total", 'finished_reason="abort"')


def running(engine) -> int:
    return httpx.get(engine.url + "/load").json()["num_running"]


def test_a_client_leaving_a_non_streaming_request_stops_it_at_the_instance(stack):
    engine, gw = stack
    before = aborted(engine)
    s = connect(gw.port)
    s.sendall(post("/v1/completions", {"model": "tiny", "prompt": "go", "max_tokens": 2000, "ignore_eos": True}))
    wait_for(lambda: running(engine) == 1, 30, "the request to run")
    s.close()
    wait_for(lambda: running(engine) == 0, 5, "the request to stop")
    assert aborted(engine) == before + 1
    r = gw.client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200


def test_a_stream_nobody_reads_is_dropped_and_stops_at_the_instance(stack):
    """Once the client's socket is full, the gateway's send timeout drops it; the relay
    then closes its upstream connection and the instance aborts every choice."""
    engine, gw = stack
    before = aborted(engine)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 1900,
            "ignore_eos": True, "n": N, "stream": True, "logprobs": True, "top_logprobs": 20}
    with connect(gw.port, rcvbuf=4096) as s:
        s.sendall(post("/v1/chat/completions", body))
        wait_for(lambda: aborted(engine) == before + N, 120, "the unread stream's sequences to be aborted")
        assert running(engine) == 0
        assert was_reset(s, within_s=SLACK_S)
    assert metric(engine, "vllm:generation_tokens_total") < N * 1900


def test_the_gateway_refuses_oversized_headers_and_urls(stack):
    _, gw = stack
    resp = exchange(gw.port, post("/v1/completions", {"model": "tiny", "prompt": "hi"},
                                  headers=b"x-big: " + b"a" * 40_000 + b"\r\n"))
    assert status(resp) == 431 and b"headers_too_large" in resp
    assert status(exchange(gw.port, b"GET /health?" + b"q" * 20_000 + b" HTTP/1.1\r\nhost: t\r\n\r\n")) == 414


def test_the_gateway_cuts_slowloris_and_slow_bodies(stack):
    _, gw = stack
    ended = dribble_heads(gw.port, 3, give_up_s=TIMEOUT_S + SLACK_S)
    assert [status(a) for _, a in ended] == [408] * 3
    assert status(dribble_body(gw.port, "/v1/completions", give_up_s=TIMEOUT_S + SLACK_S)) == 408


def test_over_the_gateways_connection_cap_requests_get_503(stack):
    _, gw = stack
    idle = [connect(gw.port) for _ in range(MAX_CONNECTIONS)]
    try:
        t0 = time.monotonic()
        assert status(exchange(gw.port, b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")) == 503
        assert time.monotonic() - t0 < TIMEOUT_S
    finally:
        for s in idle:
            s.close()
    wait_for(lambda: httpx.get(gw.url + "/health").status_code == 200, SLACK_S, "a 200 below the cap")


def test_llmserve_serve_hosts_the_gateway_behind_the_guard(monkeypatch, tmp_path):
    from llmserve.serve import serve
    from tests.autoscale.fakes import FakeProvider

    served = {}
    monkeypatch.setattr(serve, "build_provider", lambda cfg: FakeProvider())
    # (serve binds its port first, then runs uvicorn's Server on that socket)
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets=None: served.update(
        http=server.config.http, limit_concurrency=server.config.limit_concurrency, sockets=sockets))
    p = argparse.ArgumentParser()
    serve.add_serve_args(p)
    model = make_tiny_llama(tmp_path / "m")  # (serve refuses a model that is not there before anything starts)
    assert serve.run_serve(p.parse_args(["--model", str(model), "--log-dir", str(tmp_path)])) == 0
    assert issubclass(served["http"], GuardedHttpToolsProtocol)
    assert served["http"].limits == LimitsConfig().http_limits()
    assert served["limit_concurrency"] == LimitsConfig().max_connections
