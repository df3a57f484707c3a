"""The API-key and body-limit rules, once for the gateway and the instance server:
both layers must say yes and no to the same requests."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmserve.api.errors import APIError
from llmserve.api.limits import bearer_token, declared_over, find_key
from llmserve.gateway.auth import ClientAuth, Privileges
from llmserve.priority import PriorityClass
from llmserve.server.guards import ApiKeyAuth, BodyLimit

HEADERS = ["Bearer k1", "bearer k1", "BEARER  k1 ", "Bearer k2", "Bearer k3", "Basic k1", "k1", "", None,
           "Bearerk1", "Bearer "]


def test_bearer_token_and_find_key():
    assert bearer_token("bEaReR abc ") == b"abc" and bearer_token(b"Bearer x") == b"x"
    assert bearer_token("Basic abc") == b"" and bearer_token(None) == b""
    assert find_key(b"b", [b"a", b"b", b"b"]) == 1 and find_key(b"c", [b"a", b"b"]) is None
    assert find_key(b"", [b"a"]) is None


async def _server_status(header: str | None) -> int:
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent = []

    async def send(msg):
        sent.append(msg)

    headers = [] if header is None else [(b"authorization", header.encode())]
    await ApiKeyAuth(app, ["k1", "k2"])({"type": "http", "path": "/v1/models", "headers": headers}, None, send)
    return sent[0]["status"]


@pytest.mark.parametrize("header", HEADERS)
def test_the_gateway_and_the_instance_accept_the_same_keys(header):
    p = Privileges.build(PriorityClass.REALTIME)
    gateway = ClientAuth({"k1": p, "k2": p}, p)
    try:
        gateway.identify(header)
        gateway_ok = True
    except APIError as e:
        assert e.status == 401
        gateway_ok = False
    assert (asyncio.run(_server_status(header)) == 200) == gateway_ok
    assert gateway_ok == (header is not None and header.strip().lower().startswith("bearer")
                          and header.split()[-1] in ("k1", "k2") and len(header.split()) == 2)


def test_the_instance_refuses_a_declared_oversized_body_as_the_gateway_does():
    assert declared_over([(b"content-length", b"11")], 10) and not declared_over([(b"content-length", b"10")], 10)
    sent = []

    async def send(msg):
        sent.append(msg)

    async def app(scope, receive, send):  # pragma: no cover - never reached
        raise AssertionError("the body limit let an oversized request through")

    asyncio.run(BodyLimit(app, 10)({"type": "http", "headers": [(b"content-length", b"99")]}, None, send))
    assert sent[0]["status"] == 413 and json.loads(sent[1]["body"])["error"]["code"] == "body_too_large"
