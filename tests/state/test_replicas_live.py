"""Gateway replicas (real ``llmserve gateway --config`` processes) sharing one real,
password-protected redis-server: a rollout and instance overrides driven through either
replica's admin API are the ones both show and route by; Redis killed mid-canary leaves serving untouched
and freezes the rollout, which resumes when Redis returns; a replica that cannot
authenticate refuses to start with one line."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import pytest
import yaml

from tests.gateway.fake_upstream import Behaviour, ServerThread, make_app
from tests.gateway.test_gateway_engines import GatewayProcess, gateway_config

pytestmark = pytest.mark.slow

# A rollout of many short steps; margins wide enough that a clean canary passes a step
# in a few dozen requests, so the analysis looks (and writes) every interval.
CANARY = {"version": "canary", "stable": "v1", "start_weight": 0.2, "step_weight": 0.1,
          "max_weight": 0.9, "interval_s": 1, "min_requests": 3, "failure_threshold": 3,
          "latency_slack_s": 0.5, "max_error_rate_delta": 0.3, "max_refusal_rate_delta": 0.3}


@pytest.fixture
def upstreams():
    servers = {v: ServerThread(make_app(Behaviour(v, tokens=2))).start() for v in ("v1", "canary")}
    yield {v: s.url for v, s in servers.items()}
    for s in servers.values():
        s.stop(force=True)


def _replicas(n, upstreams, redis_server, tmp_path, canary):
    cfg = gateway_config({v: [u] for v, u in upstreams.items()}, weights={"v1": 1, "canary": 0},
                         canary=canary)
    cfg["state"] = {"dir": str(tmp_path / "state"), "redis_url": redis_server.url}
    out = [GatewayProcess(cfg, tmp_path) for _ in range(n)]
    for gw in out:
        gw.wait_all_ready()
    return out


def _chat(gw, user: str) -> httpx.Response:
    return gw.client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "user": user})


def _canary(gw) -> dict:
    return gw.admin("GET", "/models/tiny/canary").json()


def _shared(gw) -> dict:
    """/ready's shared_state details ({} while /ready is 503: no instance ready this instant)."""
    return gw.client.get("/ready").json().get("shared_state", {})


def _events(gw) -> list[dict]:
    return gw.admin("GET", "/models/tiny/canary/history").json()["events"]


def _wait(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_replicas_share_one_rollout_driven_from_either(upstreams, redis_server, tmp_path):
    a, b = _replicas(2, upstreams, redis_server, tmp_path, {**CANARY, "interval_s": 3600})
    try:
        assert _events(a) == _events(b) and [e["action"] for e in _events(a)] == ["start"]
        for i in range(20):  # through A only: B's evidence has them too, whichever replica looks
            assert _chat(a, f"early-{i}").status_code == 200

        def seen_by_b() -> int:
            return sum(v["requests"] for v in _canary(b)["evidence"].values())
        _wait(lambda: seen_by_b() == 20, 10, "A's outcomes in B's evidence")
        assert a.admin("POST", "/models/tiny/canary/pause", json={"reason": "on A"}).status_code == 200
        assert _canary(b)["state"] == "paused"
        assert b.admin("POST", "/models/tiny/canary/rollback", json={"reason": "on B"}).status_code == 200
        assert _canary(a)["state"] == "rolled_back"
        _wait(lambda: a.admin("GET", "/models").json()["models"][0]["versions"][1]["weight"] == 0.0,
              10, "A's router to take B's rollback")
        served = Counter(_chat(a, f"user-{i}").headers["x-llmserve-version"] for i in range(30))
        assert served == {"v1": 30}
        assert a.admin("POST", "/models/tiny/canary/start").status_code == 200  # a rolled-back canary, again
        assert a.admin("POST", "/models/tiny/canary/promote").status_code == 200
        _wait(lambda: b.admin("GET", "/models").json()["models"][0]["versions"][1]["weight"] == 1.0,
              10, "B's router to take A's promote")
        served = Counter(_chat(b, f"user-{i}").headers["x-llmserve-version"] for i in range(30))
        assert served == {"canary": 30}  # B obeys the promote A was told
        assert b.admin("POST", "/models/tiny/canary/resume").status_code == 409  # promoted, as A left it
        assert b.admin("POST", "/models/tiny/canary/start").status_code == 409  # the promoted is the stable
        history = _events(a)
        assert history == _events(b)

        def ids(gw, version="v1") -> set[str]:
            return {i["instance_id"] for i in gw.admin("GET", f"/models/tiny/versions/{version}/instances").json()[
                "instances"]}
        extra = upstreams["canary"].replace("127.0.0.1", "localhost")  # one more address for v1
        r = a.admin("POST", "/models/tiny/versions/v1/instances", json={"url": extra, "instance_id": "extra"})
        assert r.status_code == 201, r.text
        _wait(lambda: "extra" in ids(b), 10, "A's added instance on B")
        assert b.admin("POST", "/models/tiny/versions/v1/instances/extra/drain").status_code == 200
        _wait(lambda: any(i["draining"] for i in a.admin("GET", "/models/tiny/versions/v1/instances").json()[
            "instances"] if i["instance_id"] == "extra"), 10, "B's drain on A")
        assert b.admin("DELETE", "/models/tiny/versions/v1/instances/extra").status_code == 200
        _wait(lambda: "extra" not in ids(a), 10, "B's removal on A")
        assert [(e["action"], e["reason"]) for e in history][1:] == [
            ("pause", "on A"), ("rollback", "on B"), ("start", "admin start"),
            ("promote", "admin promote")]
    finally:
        for gw in (a, b):
            gw.stop()


def test_redis_killed_and_restarted_mid_canary(upstreams, redis_server, tmp_path):
    replicas = _replicas(2, upstreams, redis_server, tmp_path, CANARY)
    failures: list[str] = []
    sent = [0]
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            gw = replicas[i % 2]
            try:
                r = _chat(gw, f"user-{i}")
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
            except httpx.HTTPError as e:
                failures.append(repr(e))
            sent[0] += 1
            i += 1

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    a, b = replicas
    try:
        _wait(lambda: any(e["action"] == "advance" for e in _events(a)), 90, "a first advance")
        redis_server.stop()  # kill -9, mid-canary
        for gw in replicas:
            _wait(lambda: _shared(gw).get("rollouts") == "frozen", 20, "the replicas to notice the outage")
        frozen = [(_canary(gw)["weight"], len(_events(gw))) for gw in replicas]
        before = sent[0]
        time.sleep(3 * CANARY["interval_s"] + 1)  # three looks would have been due
        assert [(_canary(gw)["weight"], len(_events(gw))) for gw in replicas] == frozen
        assert _canary(a)["state"] == "progressing"
        assert sent[0] - before > 10 and not failures, failures[:5]  # serving went on
        r = b.admin("POST", "/models/tiny/canary/promote")
        assert r.status_code == 503 and r.json()["error"]["code"] == "shared_state_frozen"
        assert "shared_state_up 0.0" in a.client.get("/metrics").text
        _wait(lambda: _shared(a).get("store") == "unreachable", 10, "/ready to say so")
        assert _shared(a)["since"] > 0

        redis_server.start()  # same port, empty (no persistence)
        for gw in replicas:
            _wait(lambda: _shared(gw).get("rollouts") == "live", 20, "the replicas to see the store again")
        weight_then = frozen[0][0]
        _wait(lambda: _canary(a)["weight"] > weight_then, 90, "the rollout to go on")
        assert "shared_state_up 1.0" in b.client.get("/metrics").text
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    try:
        assert not any(t.is_alive() for t in threads), "a request still open 30 s after the load stopped"
        assert not failures, failures[:5]
        _wait(lambda: _events(a) == _events(b), 10, "both replicas to agree")
        actions = [e["action"] for e in _events(a)]
        assert actions[0] == "start" and "rollback" not in actions and "hold" not in actions
    finally:
        for gw in replicas:
            gw.stop()


def test_a_replica_that_cannot_authenticate_refuses_to_start(upstreams, redis_server, tmp_path):
    cfg = gateway_config({v: [u] for v, u in upstreams.items()})
    bad = redis_server.url.replace(redis_server.password, "not-the-password")
    cfg["state"] = {"dir": str(tmp_path / "state"), "redis_url": bad}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run([sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(path),
                           "--port", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("llmserve: error: Redis at redis://:***@127.0.0.1:")
    assert "refused our credentials" in lines[0] and "not-the-password" not in done.stderr
