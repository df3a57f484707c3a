"""A real gateway process (``llmserve gateway --config``) in front of real
``llmserve engine`` processes serving a tiny random Llama model."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.helpers import make_tiny_llama
from tests.server.harness import free_port, start_engine

pytestmark = pytest.mark.slow

ADMIN = "admin-key-for-engine-tests-0123"
POLLING = {"load_interval_s": 0.1, "ready_interval_s": 0.2, "timeout_s": 1.0}
LONG_PREFIX = "You are a meticulous assistant that answers in one short sentence. " * 4


class GatewayProcess:
    def __init__(self, config: dict, tmp_path: Path) -> None:
        self.port = free_port()
        cfg_path = tmp_path / f"gateway-{self.port}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp_path / f"gateway-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(cfg_path),
                 "--port", str(self.port), "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def admin(self, method: str, path: str, **kw) -> httpx.Response:
        return self.client.request(method, f"/admin{path}",
                                   headers={"authorization": f"Bearer {ADMIN}"}, **kw)

    def instances(self) -> list[dict]:
        return [i for p in self.admin("GET", "/pools").json()["pools"] for i in p["instances"]]

    def wait_all_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{self.log_path.read_text()}")
            try:
                inst = self.instances()
                if inst and all(i["ready"] and i["report"] for i in inst):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"gateway upstreams not ready:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:  # in-flight requests get 20 s (GRACEFUL_S), each shutdown step 5 s
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                tail = self.log_path.read_text()[-4000:]
                raise AssertionError(f"the gateway did not exit within 60 s of SIGTERM:\n{tail}") from None


def gateway_config(versions: dict[str, list[str]], *, weights: dict[str, float] | None = None,
                   **model) -> dict:
    return {"models": [{"name": "tiny", "versions": [
        {"name": v, "weight": (weights or {}).get(v, 1.0), "upstreams": urls}
        for v, urls in versions.items()], **model}],
        "polling": POLLING, "auth": {"admin_key": ADMIN},
        "breaker": {"failure_threshold": 2, "cooloff_s": 1.0, "max_cooloff_s": 2.0}}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=1024)  # room for a tools prompt


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module")
def engines(tiny_path, logs):
    """Two healthy engines and one that fails half its requests, started together."""
    specs = {"a": [], "b": [], "faulty": ["--fault-error-rate", "0.5"]}
    procs = {name: start_engine(tiny_path, logs, "--served-model-name", "tiny",
                                "--instance-id", name, *args, wait=False)
             for name, args in specs.items()}
    try:
        for ep in procs.values():
            ep.wait_ready()
        yield procs
    finally:
        for ep in procs.values():
            ep.stop()


@pytest.fixture
def gateway(logs):
    started: list[GatewayProcess] = []

    def start(config: dict) -> GatewayProcess:
        gw = GatewayProcess(config, logs)
        started.append(gw)
        gw.wait_all_ready()
        return gw

    yield start
    for gw in started:
        gw.stop()


def test_openai_client_through_the_gateway(engines, gateway):
    gw = gateway(gateway_config({"v1": [engines["a"].url, engines["b"].url]}))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    # the model's family and context length, as its engines report them
    [own] = httpx.get(engines["a"].url + "/v1/models").json()["data"]
    [card] = gw.client.get("/v1/models").json()["data"]
    assert own["family"] == "llama" and own["context_length"] > 0
    assert {k: card[k] for k in ("family", "context_length", "max_model_len")} == {
        k: own[k] for k in ("family", "context_length", "max_model_len")}
    r = client.completions.create(model="tiny", prompt="hello world", max_tokens=5,
                                  temperature=0)
    assert r.usage.completion_tokens == 5
    msgs = [{"role": "user", "content": "hi there"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8,
                                          temperature=0).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True) if c.choices]
    assert "".join(parts) == full
    raw = gw.client.post("/v1/completions", json={"model": "tiny", "prompt": "x",
                                                  "max_tokens": 2})
    assert raw.headers["x-llmserve-version"] == "v1"
    assert raw.headers["x-llmserve-upstream"] in {"127.0.0.1:%d" % engines[n].port
                                                  for n in "ab"}
    # the engines' /load reports are read and used (max_num_seqs sets the target)
    for inst in gw.instances():
        assert inst["load_source"] == "load" and inst["report"]["max_num_seqs"] > 0
        assert inst["report"]["instance_id"] in ("a", "b")


def test_a_faulty_canary_is_rolled_back_and_a_healthy_one_promoted(engines, gateway):
    canary = {"version": "canary", "stable": "v1", "start_weight": 0.3, "step_weight": 0.3,
              "max_weight": 0.6, "interval_s": 1.0, "failure_threshold": 2, "min_requests": 3,
              "latency_slack_s": 0.5, "max_error_rate_delta": 0.05,  # 5 points: ~150 clean requests a step
              "max_refusal_rate_delta": 0.05}
    for canary_engine, verdict in (("faulty", "rolled_back"), ("b", "promoted")):
        gw = gateway(gateway_config({"v1": [engines["a"].url],
                                     "canary": [engines[canary_engine].url]},
                                    weights={"v1": 1, "canary": 0}, canary=canary))
        deadline, i = time.monotonic() + 60, 0
        while gw.admin("GET", "/models/tiny/canary").json()["state"] == "progressing":
            assert time.monotonic() < deadline, gw.admin("GET", "/models/tiny/canary").json()
            gw.client.post("/v1/completions", json={"model": "tiny", "prompt": f"p{i}",
                                                    "max_tokens": 2, "user": f"u{i}"})
            i += 1
        status = gw.admin("GET", "/models/tiny/canary").json()
        assert status["state"] == verdict, status
        history = gw.admin("GET", "/models/tiny/canary/history").json()["events"]
        if verdict == "rolled_back":
            assert status["weight"] == 0.0 and "error rate canary" in history[-1]["reason"]
        else:
            assert status["weight"] == 1.0
            assert any(e["action"] == "advance" for e in history)
        gw.stop()


def test_prefix_affinity_sends_repeats_to_one_instance_whose_hit_rate_rises(engines, gateway):
    gw = gateway(gateway_config({"v1": [engines["a"].url, engines["b"].url]}))
    before = {n: httpx.get(engines[n].url + "/load").json()["prefix_cache_hit_rate"]
              for n in "ab"}
    picks = Counter()
    for i in range(8):
        r = gw.client.post("/v1/completions", json={
            "model": "tiny", "prompt": LONG_PREFIX + f"Question {i}?", "max_tokens": 2})
        assert r.status_code == 200
        picks[r.headers["x-llmserve-upstream"]] += 1
    assert len(picks) == 1
    chosen = next(n for n in "ab" if f"127.0.0.1:{engines[n].port}" in picks)
    after = httpx.get(engines[chosen].url + "/load").json()["prefix_cache_hit_rate"]
    assert after > before[chosen]


def _stream(gw: GatewayProcess, prompt: str) -> tuple[int, list[str]]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "stream": True,
            "ignore_eos": True}
    with gw.client.stream("POST", "/v1/completions", json=body) as r:
        events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        return r.status_code, events


def test_killed_instance_requests_retry_elsewhere_breaker_opens_traffic_returns(
        engines, tiny_path, logs, gateway):
    """Runs last in this module: it kills engine b (and leaves a revived one in its place)."""
    a, b = engines["a"], engines["b"]
    gw = gateway(gateway_config({"v1": [a.url, b.url]}))
    results: list[tuple[int, list[str]]] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        k = 0
        while not stop.is_set():
            results.append(_stream(gw, f"w{worker} r{k}"))
            k += 1

    workers = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for t in workers:
        t.start()
    time.sleep(1.5)
    b.stop()  # SIGKILL mid-load
    time.sleep(2.0)
    stop.set()
    for t in workers:
        t.join(timeout=60)

    assert len(results) > 10
    complete = [ev for status, ev in results if status == 200 and ev[-1] == "[DONE]"]
    broken = [ev for status, ev in results if ev and ev[-1] != "[DONE]"]
    # nothing ends silently: every stream is complete or ends with an error event
    assert len(complete) + len(broken) == len(results)
    assert all("error" in json.loads(ev[-1]) for ev in broken)
    # only streams already running on b when it died can fail: at most one per worker
    assert len(broken) <= 4, broken
    b_id = f"127.0.0.1:{b.port}"
    inst = {i["instance_id"]: i for i in gw.instances()}
    assert not inst[b_id]["ready"] or inst[b_id]["breaker"] != "closed"
    after = [gw.client.post("/v1/completions", json={"model": "tiny", "prompt": f"z{i}",
                                                     "max_tokens": 2}) for i in range(6)]
    assert all(r.status_code == 200 for r in after)
    assert all(r.headers["x-llmserve-upstream"] != b_id for r in after)

    engines["b"] = start_engine(tiny_path, logs, "--served-model-name", "tiny",
                                "--instance-id", "b2", port=b.port)
    deadline = time.monotonic() + 30
    picks: Counter = Counter()
    while picks[b_id] == 0:
        assert time.monotonic() < deadline, "traffic did not return to the revived instance"
        r = gw.client.post("/v1/completions", json={"model": "tiny", "prompt": "back",
                                                    "max_tokens": 2})
        assert r.status_code == 200
        picks[r.headers["x-llmserve-upstream"]] += 1


TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up", "parameters": {
    "type": "object", "properties": {"word": {"type": "string", "maxLength": 6}}, "required": ["word"],
    "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_structured_outputs_and_tools_pass_through_the_gateway_with_affinity(engines, gateway):
    """The gateway forwards the new fields untouched: schema-valid answers and calls come
    back, whole and streamed, and requests sharing tools stay on one instance."""
    import jsonschema

    gw = gateway(gateway_config({"v1": [engines["a"].url, engines["b"].url]}))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "hi there"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=40, temperature=1.0, n=3,
                                       response_format=fmt)
    for ch in r.choices:
        jsonschema.validate(json.loads(ch.message.content), SCHEMA)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=40, temperature=1.0, response_format=fmt, stream=True)
        if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    picks = Counter()
    for i in range(4):
        resp = gw.client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": f"Question {i}?"}], "tools": [TOOL],
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 150, "temperature": 1.0})
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        call = choice["message"]["tool_calls"][0]["function"]
        assert choice["finish_reason"] == "tool_calls" and call["name"] == "lookup"
        jsonschema.validate(json.loads(call["arguments"]), TOOL["function"]["parameters"])
        picks[resp.headers["x-llmserve-upstream"]] += 1
    assert len(picks) == 1
    bad = gw.client.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs, "frobnicate": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "frobnicate"
