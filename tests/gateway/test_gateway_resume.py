"""Reclaims without notice lose nothing: a real gateway in front of real tiny engines,
the engine serving a stream SIGKILLed mid-way, and the client's stream completes
with ``[DONE]``, its text equal to an undisturbed run's, no chunk twice, one id."""

from __future__ import annotations

import json
import signal

import pytest

from tests.gateway.test_gateway_engines import GatewayProcess, gateway_config
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

pytestmark = pytest.mark.slow

TOKENS = 120
# Before each chunk the engine sends: a stream takes seconds, so it is in flight when killed
# (the engine has generated further than it has sent: those tokens die with it).
CHUNK_LATENCY_MS = "15"
KILL_AFTER_EVENTS = 12

CASES = {
    "completion-greedy": ("/v1/completions", {"prompt": "Once upon a time", "temperature": 0}),
    "chat-greedy": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}],
                                             "temperature": 0}),
    "completion-seeded": ("/v1/completions", {"prompt": "The quick brown fox", "temperature": 1.0,
                                              "top_p": 0.9, "seed": 4242}),
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """One engine more than the cases kill, plus one: each case kills one of two."""
    path = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=1024)
    logs = tmp_path_factory.mktemp("logs")
    procs = [start_engine(path, logs, "--served-model-name", "tiny", "--instance-id", f"e{i}",
                          "--fault-chunk-latency-ms", CHUNK_LATENCY_MS, wait=False)
             for i in range(len(CASES) + 1)]
    try:
        for ep in procs:
            ep.wait_ready()
        yield procs
    finally:
        for ep in procs:
            ep.stop()


def read(gw: GatewayProcess, path: str, body: dict, kill=None) -> tuple[list[dict], str]:
    """The stream's JSON events (``[DONE]`` asserted last) and the instance that began it;
    ``kill(upstream)`` is called once KILL_AFTER_EVENTS events are in."""
    with gw.client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        upstream = r.headers["x-llmserve-upstream"]
        events: list[str] = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if kill is not None and len(events) == KILL_AFTER_EVENTS:
                    kill(upstream)
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]], upstream


def text_of(chunks: list[dict]) -> str:
    out = []
    for c in chunks:
        for ch in c["choices"]:
            out.append(ch["text"] if "text" in ch else ch["delta"].get("content") or "")
    return "".join(out)


def retries(gw: GatewayProcess) -> float:
    lines = [ln for ln in gw.client.get("/metrics").text.splitlines()
             if ln.startswith("llmserve:gateway_retries_total{")]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_a_stream_whose_engine_is_killed_mid_way_completes_as_if_undisturbed(engines, tmp_path):
    live = list(engines)
    bodies = {name: (path, {"model": "tiny", "stream": True, "max_tokens": TOKENS, "ignore_eos": True,
                            "stream_options": {"include_usage": True}, **extra})
              for name, (path, extra) in CASES.items()}
    gw = GatewayProcess(gateway_config({"v1": [ep.url for ep in live[:2]]}), tmp_path)
    try:
        gw.wait_all_ready()
        undisturbed = {name: read(gw, path, body)[0] for name, (path, body) in bodies.items()}
    finally:
        gw.stop()
    for name, (path, body) in bodies.items():
        ref = undisturbed[name]
        assert not any("token_ids" in ch for c in ref for ch in c["choices"])  # the gateway's own
        assert ref[-1]["usage"]["completion_tokens"] == TOKENS
        pair = live[:2]
        gw = GatewayProcess(gateway_config({"v1": [ep.url for ep in pair]}), tmp_path)
        killed = []

        def kill(upstream: str) -> None:
            ep = next(ep for ep in pair if upstream == f"127.0.0.1:{ep.port}")
            ep.proc.send_signal(signal.SIGKILL)
            ep.proc.wait(timeout=10)
            killed.append(ep)

        try:
            gw.wait_all_ready()
            before = retries(gw)
            chunks, _ = read(gw, path, body, kill)
            assert killed, name
            assert retries(gw) == before + 1  # resumed once, on the other engine
        finally:
            gw.stop()
        live.remove(killed[0])
        assert text_of(chunks) == text_of(ref), name  # no gap, no chunk twice
        assert len(chunks) > KILL_AFTER_EVENTS
        assert {(c["id"], c["created"]) for c in chunks} == {(chunks[0]["id"], chunks[0]["created"])}
        assert [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")] == [TOKENS]
        assert not any("token_ids" in ch for c in chunks for ch in c["choices"])
        if "messages" in body:
            assert sum("role" in ch["delta"] for c in chunks for ch in c["choices"]) == 1
        finals = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
        assert finals == ["length"]
