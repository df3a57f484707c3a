"""Real processes export to a real OTLP/HTTP receiver: ``llmserve gateway --otlp-endpoint``
and ``llmserve engine`` (through ``OTEL_EXPORTER_OTLP_ENDPOINT``) send one trace in which
the gateway's, the instance's and the engine process's spans are joined."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from tests.helpers import make_tiny_llama
from tests.server.harness import free_port, start_engine
from tests.tracing.otlp_receiver import Receiver

pytestmark = pytest.mark.slow


def test_gateway_instance_and_engine_spans_reach_an_otlp_receiver_as_one_trace(tmp_path, monkeypatch):
    model = make_tiny_llama(tmp_path / "model")
    with Receiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url)  # the instance: the standard variable
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # (the SDK's own: export within 0.1 s)
        engine = start_engine(model, tmp_path, "--served-model-name", "tiny")
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
        port = free_port()
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": [{"name": "tiny", "versions": [
            {"name": "v1", "weight": 1.0, "upstreams": [engine.url]}]}],
            "polling": {"load_interval_s": 0.1, "ready_interval_s": 0.2, "timeout_s": 1.0}}))
        gw = subprocess.Popen([sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(cfg), "--port",
                               str(port), "--otlp-endpoint", rx.url, "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ})
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline and gw.poll() is None, "gateway not ready"
                time.sleep(0.1)
            body = {"model": "tiny", "prompt": "Once", "max_tokens": 5, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                trace_id = r.headers["server-timing"].split('trace;desc="')[1][:32]
                assert [ln for ln in r.iter_lines() if ln.startswith("data: ")][-1] == "data: [DONE]"
            want = {"text_completion tiny", "gateway.route", "gateway.admission", "gateway.attempt",
                    "engine.request", "engine.queue", "engine.prefill", "engine.decode"}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = [s for s in rx.spans if s["trace_id"] == trace_id]
                if want <= {s["name"] for s in got} and len(got) >= len(want) + 1:
                    break
                time.sleep(0.1)
        finally:
            gw.terminate()
            gw.wait(timeout=10)
            engine.stop()
    assert set(rx.posts) == {"/v1/traces"}
    by_service: dict[str, dict[str, dict]] = {}
    for s in got:
        by_service.setdefault(s["service"], {})[s["name"]] = s
    assert set(by_service) == {"llmserve-gateway", "llmserve-instance", "llmserve-engine"}, by_service.keys()
    g, i, e = by_service["llmserve-gateway"], by_service["llmserve-instance"], by_service["llmserve-engine"]
    assert i["text_completion tiny"]["parent_id"] == g["gateway.attempt"]["span_id"]
    assert e["engine.request"]["parent_id"] == i["text_completion tiny"]["span_id"]
    assert e["engine.decode"]["parent_id"] == e["engine.request"]["span_id"]
    assert e["engine.request"]["pid"] != i["text_completion tiny"]["pid"] != g["gateway.route"]["pid"]
    assert i["text_completion tiny"]["attributes"]["gen_ai.usage.output_tokens"] == 5
    assert g["text_completion tiny"]["attributes"]["gen_ai.operation.name"] == "text_completion"
