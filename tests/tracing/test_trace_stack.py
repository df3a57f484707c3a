"""One streamed request through a gateway and an instance whose engine core runs in its
own process: one trace, from the client's traceparent down to the engine's phases,
every span under the right parent, across the gateway, the API process and the
engine process (spans caught by in-memory exporters, tests/tracing/traced_stack.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import make_tiny_llama
from tests.tracing.traced_stack import CLIENT_TRACEPARENT
from llmserve.tracing.timing import parse_server_timing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    model = make_tiny_llama(tmp / "model")
    out = tmp / "out.json"
    p = subprocess.run([sys.executable, "-m", "tests.tracing.traced_stack", str(model), str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.returncode == 0, p.stderr[-4000:]
    result = json.loads(out.read_text())
    result["log"] = [json.loads(ln) for ln in p.stderr.splitlines() if ln.startswith("{")]
    return result


def one_trace(result: dict, trace_id: str) -> dict[str, list[dict]]:
    by_name: dict[str, list[dict]] = {}
    for s in result["spans"]:
        if s["trace_id"] == trace_id:
            by_name.setdefault(s["name"], []).append(s)
    return by_name


def test_a_streamed_request_is_one_trace_from_the_client_to_the_engine_process(run):
    assert run["stream_status"] == 200 and run["stream_events"][-1] == "data: [DONE]"
    client_trace, client_span = CLIENT_TRACEPARENT.split("-")[1:3]
    t = one_trace(run, client_trace)
    (gw,) = [s for s in t["chat tiny"] if s["service"] == "llmserve-gateway"]
    (inst,) = [s for s in t["chat tiny"] if s["service"] == "llmserve-instance"]
    assert gw["kind"] == inst["kind"] == "SERVER"
    assert gw["parent_id"] == client_span  # joined to the caller's trace
    (route,), (admission,), (attempt,) = t["gateway.route"], t["gateway.admission"], t["gateway.attempt"]
    assert {route["parent_id"], admission["parent_id"], attempt["parent_id"]} == {gw["span_id"]}
    assert attempt["kind"] == "CLIENT" and inst["parent_id"] == attempt["span_id"]
    assert route["attributes"]["llmserve.version"] == "v1" and route["attributes"]["llmserve.route.reason"]
    assert admission["attributes"]["llmserve.instance"] == attempt["attributes"]["llmserve.instance"] \
        == run["stream_headers"]["x-llmserve-upstream"]
    (req,) = t["engine.request"]
    assert req["parent_id"] == inst["span_id"] and req["service"] == "llmserve-engine"
    phases = [t[n][0] for n in ("engine.queue", "engine.prefill", "engine.decode")]
    assert {p["parent_id"] for p in phases} == {req["span_id"]}
    # Made in the engine process, exported by the API process.
    assert {s["pid"] for s in [req, *phases]} == {run["engine_pid"]} != {run["api_pid"]}
    assert {gw["pid"], inst["pid"]} == {run["api_pid"]}
    # One after another, inside the instance's span, inside the gateway's attempt.
    assert req["start"] <= phases[0]["start"] <= phases[0]["end"] <= phases[1]["start"] <= phases[1]["end"] \
        <= phases[2]["start"] <= phases[2]["end"] <= req["end"]
    assert attempt["start"] <= inst["start"] and inst["end"] <= attempt["end"] <= gw["end"]
    # GenAI semantic-convention attributes.
    for s in (gw, inst):
        assert s["attributes"]["gen_ai.operation.name"] == "chat"
        assert s["attributes"]["gen_ai.request.model"] == "tiny"
    assert gw["attributes"]["gen_ai.request.max_tokens"] == 6
    assert inst["attributes"]["gen_ai.usage.output_tokens"] == req["attributes"]["gen_ai.usage.output_tokens"] == 6
    assert inst["attributes"]["gen_ai.usage.input_tokens"] == req["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert gw["attributes"]["gen_ai.usage.output_tokens"] == 6 and gw["attributes"]["llmserve.attempts"] == 1
    assert req["attributes"]["gen_ai.response.finish_reasons"] == ["length"]


def test_timings_reach_the_response_header_and_json_access_log_lines(run):
    stream = parse_server_timing(run["stream_headers"]["server-timing"])
    assert stream["attempts"] == "1" and stream["trace"] == CLIENT_TRACEPARENT.split("-")[1]
    whole = parse_server_timing(run["whole_headers"]["server-timing"])
    assert {"admission", "attempts", "queue", "prefill", "decode"} <= set(whole)
    assert all(isinstance(whole[k], float) and whole[k] >= 0 for k in ("queue", "prefill", "decode"))
    gateway_lines = [ln for ln in run["log"] if "version" in ln]
    instance_lines = [ln for ln in run["log"] if "path" in ln]
    assert len(gateway_lines) == len(instance_lines) == 2
    g, i = gateway_lines[0], instance_lines[0]
    assert g["trace_id"] == i["trace_id"] == CLIENT_TRACEPARENT.split("-")[1]
    assert g["request_id"] == i["request_id"] == run["stream_headers"]["x-request-id"]
    assert g["attempts"] == 1 and g["status"] == 200 and g["ttft_ms"] > 0 and g["output_tokens"] == 6
    assert i["output_tokens"] == 6 and {"queue_ms", "prefill_ms", "decode_ms"} <= set(i)
    spans = one_trace(run, g["trace_id"])
    decode = spans["engine.decode"][0]
    assert i["decode_ms"] == pytest.approx((decode["end"] - decode["start"]) / 1e6, abs=0.05)
