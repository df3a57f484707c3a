"""``--access-log`` writes one line per request: a request the gateway refuses before it is
routed (a bad body, a wrong key, an unknown model, a key over its limit) included, where
they were missing, so a storm of 429s or 401s did not show in the log at all."""

from __future__ import annotations

import json
import logging

from llmserve.tracing.gateway import GatewayTelemetry
from llmserve.tracing.timing import access_logger

from .app_harness import CLIENT_KEY, bearer, stack
from .fake_upstream import Behaviour


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def test_refusals_before_routing_have_their_access_line(tmp_path):
    limited = "limited-key-0123456789"
    auth = {"admin_key": "admin-key-for-tests-0123456789", "api_keys": [CLIENT_KEY],
            "keys": [{"key": limited, "name": "team-a", "limits": {"requests": 1, "window_s": 60}}]}
    seen = _Lines()
    access_logger().addHandler(seen)
    try:
        with stack({"v1": [Behaviour("a", tokens=1)]}, client_key=CLIENT_KEY,
                   telemetry=GatewayTelemetry(None, access_log=True), auth=auth) as s:
            assert s.chat(max_tokens=1).status_code == 200
            assert s.chat(max_tokens=1, bogus=1).status_code == 400
            assert s.chat(max_tokens=1, model="nope").status_code == 404
            assert s.chat(max_tokens=1, key=limited).status_code == 200
            assert s.chat(max_tokens=1, key=limited).status_code == 429
            r = s.client.post("/v1/completions", json={"model": "chat", "prompt": "x"},
                              headers={**bearer("wrong-key-0123")})
            assert r.status_code == 401
    finally:
        access_logger().removeHandler(seen)
    assert [(ln["status"], ln.get("error")) for ln in seen.lines] == [
        (200, None), (400, "unknown_parameter"), (404, "model_not_found"), (200, None),
        (429, "rate_limit_exceeded"), (401, "invalid_api_key")]
    assert [ln.get("path") for ln in seen.lines if ln["status"] >= 400] == [
        "/v1/chat/completions"] * 3 + ["/v1/completions"]
    assert all("version" in ln for ln in seen.lines if ln["status"] == 200)  # one line each, as before
