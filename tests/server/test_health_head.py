"""The engine's /health and /ready answer HEAD as GET (a load balancer's probe may send it);
it was a 405, which a probe reads as the instance down. No model needed: an instance not
started answers both."""

from __future__ import annotations

from fastapi.testclient import TestClient

from llmserve.server.app import Instance, create_app
from llmserve.server.config import ServerConfig


def _never():
    raise AssertionError("not started here")


def test_health_and_ready_answer_head_as_get():
    client = TestClient(create_app(Instance(ServerConfig(), _never)))
    for path in ("/health", "/ready"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code != 405, path
        assert head.content == b""
    assert client.head("/health").status_code == 200  # starting, alive
    assert client.head("/ready").status_code == 503  # not ready yet
