"""Privileges through the live gateway: a client's priority and version claims are
honoured only as far as its key allows, and instances see only the gateway's decision."""

from __future__ import annotations

from .app_harness import CLIENT_KEY, OPS_KEY, PRIVILEGED_AUTH, stack
from .fake_upstream import Behaviour

BATCH_KEY = "batch-only-key-0123"


def _requests(s, cls: str, version: str = "v1") -> float:
    """``gateway_requests_total`` answered 200 for one class."""
    want = f'llmserve:gateway_requests_total{{class="{cls}",model="chat",status="200",version="{version}"}} '
    for line in s.client.get("/metrics").text.splitlines():
        if line.startswith(want):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _sent(b: Behaviour) -> tuple[object, str | None]:
    """What the last request upstream said: the body's priority (absent: None) and x-priority."""
    return b.bodies[-1].get("priority"), b.headers[-1].get("x-priority")


def test_an_open_gateway_honours_no_claim_above_the_default():
    a = Behaviour("a", tokens=1)
    with stack({"v1": [a]}) as s:
        r = s.chat(priority=-1000000000)
        assert r.status_code == 200 and r.headers["x-llmserve-priority"] == "0"
        assert _sent(a) == (0, "0")
        r = s.chat(headers={"x-priority": "-1000000000"})
        assert r.status_code == 200 and _sent(a) == (None, "0")
        s.chat(headers={"x-priority": "-3"}, priority="realtime")  # the body wins; the header is not sent on
        assert _sent(a) == (0, "0")
        assert _requests(s, "realtime") == 3 and _requests(s, "batch") == 0
        # yielding is no privilege: batch (or any integer above 0) is honoured, as batch
        s.chat(headers={"x-priority": "batch"})
        assert _sent(a) == (None, "1")
        s.chat(priority=7)
        assert _sent(a) == (1, "1")
        assert _requests(s, "batch") == 2


def test_a_key_limited_to_batch_stays_batch_whatever_it_claims():
    a = Behaviour("a", tokens=1)
    auth = {"keys": [{"key": BATCH_KEY, "priorities": ["batch"], "default_priority": "batch"}]}
    with stack({"v1": [a]}, auth=auth, client_key=BATCH_KEY) as s:
        for claim in ({"priority": -1000000000}, {"priority": "realtime"}, {}):
            assert s.chat(**claim).headers["x-llmserve-priority"] == "1"
            assert _sent(a)[1] == "1"
        assert s.chat(headers={"x-priority": "-1000000000"}).status_code == 200
        assert _sent(a) == (None, "1")
        assert _requests(s, "batch") == 4 and _requests(s, "realtime") == 0


def test_a_privileged_key_sends_integers_within_its_range():
    a = Behaviour("a", tokens=1)
    with stack({"v1": [a]}, auth=PRIVILEGED_AUTH, client_key=CLIENT_KEY) as s:
        s.chat(priority=-5, key=OPS_KEY)
        assert _sent(a) == (-5, "-5")
        s.chat(headers={"x-priority": "-10"}, key=OPS_KEY)
        assert _sent(a) == (None, "-10")
        s.chat(priority=-1000000000, key=OPS_KEY)  # past its range: as its class
        assert _sent(a) == (0, "0")
        s.chat(priority=-5)  # the same claim from a default key
        assert _sent(a) == (0, "0")
        assert _requests(s, "realtime") == 4


def test_oversized_priorities_are_400s_in_openai_shape():
    a = Behaviour("a", tokens=1)
    huge = "9" * 5000
    with stack({"v1": [a]}) as s:
        body = b'{"model": "chat", "messages": [{"role": "user", "content": "x"}], "priority": -%s}' % \
            huge.encode()
        for r in (s.client.post("/v1/chat/completions", content=body,
                                headers={"content-type": "application/json"}),
                  s.chat(headers={"x-priority": huge}),
                  s.chat(priority=huge),
                  s.chat(priority=1.5)):
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert (err["param"], err["code"], err["type"]) == (
                "priority", "invalid_priority", "invalid_request_error")
            assert len(err["message"]) < 200
        # another field's huge integer is a 400 too, never sent upstream
        other = b'{"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": %s}' % \
            huge.encode()
        r = s.client.post("/v1/chat/completions", content=other, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
        assert a.requests == 0


CANARY = {"version": "canary", "stable": "v1", "auto_start": False, "interval_s": 60}
# A rollout in progress (its evidence is kept only then) that sends next to nobody.
RUNNING = {**CANARY, "auto_start": True, "start_weight": 0.001, "step_weight": 0.001,
           "max_weight": 0.001}


def test_the_version_header_routes_only_for_a_privileged_key_and_stays_out_of_canary_stats():
    v1, canary = Behaviour("stable", tokens=1), Behaviour("canary", tokens=1)
    with stack({"v1": [v1], "canary": [canary]}, weights={"v1": 1, "canary": 0},
               model={"canary": RUNNING}, auth=PRIVILEGED_AUTH, client_key=CLIENT_KEY) as s:
        rt = s.gateway.models["chat"]
        for i in range(5):
            r = s.chat(user=f"u{i}", headers={"x-llmserve-version": "canary"})
            assert r.headers["x-llmserve-version"] == "v1"
        assert canary.requests == 0
        for i in range(4):
            r = s.chat(user=f"u{i}", headers={"x-llmserve-version": "canary"}, key=OPS_KEY)
            assert r.headers["x-llmserve-version"] == "canary"
        assert canary.requests == 4
        assert rt.canary.evidence["canary"].requests == 0
        assert rt.canary.evidence["v1"].requests == 5
        text = s.client.get("/metrics").text
        assert 'llmserve:gateway_routed_total{model="chat",reason="header",version="canary"} 4.0' in text


def test_forced_requests_count_when_configured():
    v1, canary = Behaviour("stable", tokens=1), Behaviour("canary", tokens=1)
    with stack({"v1": [v1], "canary": [canary]}, weights={"v1": 1, "canary": 0},
               model={"canary": {**RUNNING, "count_forced": True}},
               auth={"open_privileges": {"version_override": True}}) as s:
        for _ in range(3):
            assert s.chat(headers={"x-llmserve-version": "canary"}).headers["x-llmserve-version"] == "canary"
        assert s.gateway.models["chat"].canary.evidence["canary"].requests == 3


def test_the_upstream_key_is_sent_and_the_clients_is_not():
    a = Behaviour("a", tokens=1)
    with stack({"v1": [a]}, version_extra={"v1": {"api_key": "instance-key-0123"}},
               auth=PRIVILEGED_AUTH, client_key=CLIENT_KEY) as s:
        assert s.chat().status_code == 200
        assert a.headers[-1]["authorization"] == "Bearer instance-key-0123"
    b = Behaviour("b", tokens=1)
    with stack({"v1": [b]}, auth=PRIVILEGED_AUTH, client_key=CLIENT_KEY) as s:
        assert s.chat().status_code == 200
        assert "authorization" not in b.headers[-1]
