"""/v1/responses and /v1/messages relay the chat route's refusals whole: a 429's
Retry-After reaches the client, as it does on /v1/chat/completions; and their successes
carry the gateway's headers a chat answer does."""

from __future__ import annotations

from tests.gateway.app_harness import ADMIN_KEY, stack
from tests.gateway.fake_upstream import Behaviour

KEY = "team-a-secret-0123"


def test_a_429_keeps_its_retry_after_on_both_frontends(tmp_path):
    keys = [{"key": KEY, "name": "team-a", "limits": {"requests": 1, "window_s": 30}}]
    with stack({"v1": [Behaviour("a")]}, client_key=KEY, auth={"admin_key": ADMIN_KEY, "keys": keys},
               state={"dir": str(tmp_path)}) as s:
        assert s.chat(max_tokens=4).status_code == 200  # the key's one request in this window
        direct = s.chat(max_tokens=4)
        assert direct.status_code == 429 and int(direct.headers["retry-after"]) >= 1
        r = s.client.post("/v1/responses", json={"model": "chat", "input": "hi"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        m = s.client.post("/v1/messages", json={"model": "chat", "max_tokens": 8,
                                                "messages": [{"role": "user", "content": "hi"}]})
        assert m.status_code == 429 and int(m.headers["retry-after"]) >= 1
        assert m.json()["error"]["type"] == "rate_limit_error"


def test_successful_answers_carry_chats_rate_limit_and_version_headers(tmp_path):
    """A 200 on /v1/responses and /v1/messages, streamed or not, carries the x-ratelimit-* and
    x-llmserve-version a chat answer does; only the refusals carried them."""
    keys = [{"key": KEY, "name": "team-a", "limits": {"requests_per_minute": 10}}]
    with stack({"v1": [Behaviour("a")]}, client_key=KEY, auth={"admin_key": ADMIN_KEY, "keys": keys},
               state={"dir": str(tmp_path)}) as s:
        got = [s.chat(max_tokens=4)]
        for stream in (False, True):
            got.append(s.client.post("/v1/responses", json={"model": "chat", "input": "hi", "stream": stream}))
            got.append(s.client.post("/v1/messages", json={"model": "chat", "max_tokens": 8, "stream": stream,
                                                           "messages": [{"role": "user", "content": "hi"}]}))
        assert [r.status_code for r in got] == [200] * 5, [r.text for r in got]
        assert [r.headers.get("x-ratelimit-remaining-requests") for r in got] == ["9", "8", "7", "6", "5"]
        assert all(r.headers.get("x-ratelimit-limit-requests") == "10" for r in got)
        assert all(r.headers.get("x-llmserve-version") == "v1" for r in got)
