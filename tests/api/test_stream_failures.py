"""A chat stream that ends in an error, seen through /v1/responses and /v1/messages on a
gateway over a fake upstream: the Responses stream ends with response.failed and
nothing is stored; the Anthropic stream ends with an error event, no message_stop."""

from __future__ import annotations

import json

from tests.gateway.app_harness import stack
from tests.gateway.fake_upstream import Behaviour


def _events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_failed_stream_is_response_failed_and_not_stored(tmp_path):
    b = Behaviour("i0", tokens=6, dead_after_tokens=3)
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}, retry={"max_resumes": 0}) as s:
        r = s.client.post("/v1/responses", json={"model": "chat", "input": "hi", "stream": True})
        events = _events(r.text)
        kinds = [e["type"] for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.failed", kinds
        assert "response.output_text.delta" in kinds and "response.completed" not in kinds
        rid = events[-1]["response"]["id"]
        assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"]
        assert s.client.get(f"/v1/responses/{rid}").status_code == 404

        m = s.client.post("/v1/messages", json={"model": "chat", "max_tokens": 8, "stream": True,
                                                "messages": [{"role": "user", "content": "hi"}]})
        kinds = [e["type"] for e in _events(m.text)]
        assert kinds[0] == "message_start" and kinds[-1] == "error" and "message_stop" not in kinds


def test_an_upstream_error_keeps_its_status_in_both_shapes(tmp_path):
    b = Behaviour("i0", error_rate=1.0, error_status=400, error_code="invalid_value")
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}) as s:
        r = s.client.post("/v1/responses", json={"model": "chat", "input": "hi"})
        assert r.status_code == 400 and r.json()["error"]["message"]
        m = s.client.post("/v1/messages", json={"model": "chat", "max_tokens": 8,
                                                "messages": [{"role": "user", "content": "hi"}]})
        assert m.status_code == 400 and m.json()["type"] == "error"
        assert m.json()["error"]["type"] == "invalid_request_error"


HOSTILE = [b"[" * 200 + b"]" * 200, b'{"input": "x", "max_output_tokens": ' + b"9" * 5000 + b"}",
           b'{"input": NaN}', b'{"input": "\\ud800"}', b"\xff\xfe", b""]


def test_hostile_bodies_are_4xx_on_every_new_endpoint(tmp_path):
    with stack({"v1": [Behaviour("i0")]}, state={"dir": str(tmp_path)}) as s:
        for path in ("/v1/responses", "/v1/messages", "/v1/batches"):
            for body in HOSTILE:
                r = s.client.post(path, content=body, headers={"content-type": "application/json"})
                assert 400 <= r.status_code < 500, (path, body[:40], r.text)
                data = r.json()
                assert data["error"]["message"]
                assert (data.get("type") == "error") == (path == "/v1/messages")
