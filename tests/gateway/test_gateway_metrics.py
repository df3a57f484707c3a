"""The gateway's /metrics: no ``*_created`` series in any process that serves it, the
canary's state and decisions, and the answered requests' tokens."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from llmserve.gateway.canary import CanaryAnalysis, CanaryConfig
from llmserve.gateway.metrics import GatewayMetrics


def _samples(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_no_created_series_in_a_fresh_process():
    # A process of its own: nothing else (another test, an env var) has turned them off first.
    code = ("from llmserve.gateway.metrics import GatewayMetrics\n"
            "m = GatewayMetrics(lambda: [])\n"
            "m.child(m.requests, 'm', 'v1', 'realtime', '200').inc()\n"
            "m.child(m.e2e, 'm', 'v1', 'realtime').observe(0.1)\n"
            "print(m.exposition().decode())\n")
    text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PATH": ""}).stdout
    samples = _samples(text)
    assert samples["llmserve:gateway_requests_total"] and samples["llmserve:gateway_e2e_request_latency_seconds_count"]
    assert not [n for n in samples if n.endswith("_created")]
    assert "_created" not in text


def test_canary_state_failed_checks_and_decisions():
    analysis = CanaryAnalysis("v2", "v1", CanaryConfig(interval_s=1.0))
    models = [SimpleNamespace(name="m", canary=analysis), SimpleNamespace(name="plain", canary=None)]
    m = GatewayMetrics(lambda: GatewayMetrics.canary_gauges(models))
    s = _samples(m.exposition().decode())
    state = {dict(k)["state"]: v for k, v in s["llmserve:gateway_canary_state"].items()}
    assert state == {"idle": 1.0, "progressing": 0.0, "paused": 0.0, "promoted": 0.0, "rolled_back": 0.0}
    assert {dict(k)["model"] for k in s["llmserve:gateway_canary_state"]} == {"m"}

    for d in (analysis.start(0.0), analysis.tick(0.5), analysis.pause(1.0)):  # the tick is not due: none
        m.canary_decided("m", analysis.canary, d.action.value)
    analysis.failed_checks = 2  # as a failed check leaves it
    s = _samples(m.exposition().decode())
    state = {dict(k)["state"]: v for k, v in s["llmserve:gateway_canary_state"].items()}
    assert state["paused"] == 1.0 and sum(state.values()) == 1.0
    assert s["llmserve:gateway_canary_failed_checks"] == {(("canary", "v2"), ("model", "m"), ("stable", "v1")): 2.0}
    verdicts = {dict(k)["action"]: v for k, v in s["llmserve:gateway_canary_verdicts_total"].items()}
    assert verdicts == {"start": 1.0, "pause": 1.0}


def test_token_counters():
    m = GatewayMetrics(lambda: [])
    m.count_tokens("m", "v1", 30, 7)
    m.count_tokens("m", "v1", None, 5)  # a stream: no usage, its data events
    s = _samples(m.exposition().decode())
    assert s["llmserve:gateway_prompt_tokens_total"] == {(("model", "m"), ("version", "v1")): 30.0}
    assert s["llmserve:gateway_generation_tokens_total"] == {(("model", "m"), ("version", "v1")): 12.0}


def test_the_live_gateway_counts_answered_tokens():
    """Through the app: a whole answer's usage reaches the token counters (the recorder's
    finish calls them), so ``llmserve bench --server-metrics`` against a gateway reads them."""
    import httpx

    from .app_harness import stack
    from .fake_upstream import Behaviour

    with stack({"v1": [Behaviour("a", tokens=3)]}) as s:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            assert httpx.post(s.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        got = _samples(s.client.get("/metrics").text)
    gen = got["llmserve:gateway_generation_tokens_total"]
    assert sum(gen.values()) == 6 and sum(got["llmserve:gateway_prompt_tokens_total"].values()) == 2
