"""Automated canary analysis in the live gateway, and its admin API."""

import time

from .app_harness import stack
from .fake_upstream import Behaviour

# Margins of 5 points on error and refusal rates: a clean canary proves that within
# about 150 requests a step, where the 1-point default needs about 600.
CANARY = {"version": "canary", "stable": "v1", "start_weight": 0.3, "step_weight": 0.2,
          "max_weight": 0.5, "interval_s": 0.5, "failure_threshold": 2, "min_requests": 3,
          "latency_slack_s": 0.05, "max_error_rate_delta": 0.05, "max_refusal_rate_delta": 0.05}


def _drive(s, until, limit_s=60.0):
    """Send traffic from many users until ``until()``, for at most ``limit_s`` seconds.

    Bounded by time, not by a request count: the analysis looks once an interval, and
    how many requests a verdict takes depends on what they show."""
    deadline = time.monotonic() + limit_s
    i = 0
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("the rollout did not settle")
        s.chat(f"q{i}", user=f"user-{i}")
        i += 1


def test_a_failing_canary_is_rolled_back_automatically():
    with stack({"v1": [Behaviour("stable", tokens=1)],
                "canary": [Behaviour("bad", tokens=1, error_rate=0.6, seed=1)]},
               weights={"v1": 1, "canary": 0}, model={"canary": CANARY}) as s:
        rt = s.gateway.models["chat"]
        assert s.admin("GET", "/models/chat/canary").json()["state"] == "progressing"
        _drive(s, lambda: rt.canary.state.value == "rolled_back")
        status = s.admin("GET", "/models/chat/canary").json()
        assert status["weight"] == 0.0 and status["failed_checks"] == 2
        events = s.admin("GET", "/models/chat/canary/history").json()["events"]
        assert events[0]["action"] == "start" and events[-1]["action"] == "rollback"
        assert "error rate canary" in events[-1]["reason"] and "(canary: " in events[-1]["reason"]  # its error kinds
        # nothing goes to the canary any more
        before = s.fakes["bad"].requests
        for i in range(20):
            assert s.chat(user=f"later-{i}").headers["x-llmserve-version"] == "v1"
        assert s.fakes["bad"].requests == before
        assert 'llmserve:gateway_version_weight{model="chat",version="canary"} 0.0' in \
            s.client.get("/metrics").text


def test_a_healthy_canary_is_promoted():
    with stack({"v1": [Behaviour("stable", tokens=1)], "canary": [Behaviour("good", tokens=1)]},
               weights={"v1": 1, "canary": 0}, model={"canary": CANARY}) as s:
        rt = s.gateway.models["chat"]
        _drive(s, lambda: rt.canary.state.value == "promoted")
        actions = [e["action"] for e in
                   s.admin("GET", "/models/chat/canary/history").json()["events"]]
        assert actions[0] == "start" and actions[-1] == "promote"
        assert "advance" in actions
        assert all(s.chat(user=f"after-{i}").headers["x-llmserve-version"] == "canary"
                   for i in range(10))


def test_manual_pause_promote_rollback_through_admin():
    manual = {**CANARY, "auto_start": False, "interval_s": 60}
    with stack({"v1": [Behaviour("stable")], "canary": [Behaviour("c")]},
               weights={"v1": 1, "canary": 0}, model={"canary": manual}) as s:
        assert s.admin("GET", "/models/chat/canary").json()["state"] == "idle"
        r = s.admin("POST", "/models/chat/canary/start", json={"reason": "ship it"})
        assert r.status_code == 200 and r.json()["weight"] == 0.3
        assert s.admin("POST", "/models/chat/canary/pause").json()["state"] == "paused"
        assert s.admin("POST", "/models/chat/canary/pause").status_code == 409
        assert s.admin("POST", "/models/chat/canary/rollback").json()["weight"] == 0.0
        models = s.admin("GET", "/models").json()["models"]
        assert {v["name"]: v["weight"] for v in models[0]["versions"]} == \
            {"v1": 1.0, "canary": 0.0}
        assert s.admin("POST", "/models/chat/canary/explode").status_code == 404
        reasons = [e["reason"] for e in
                   s.admin("GET", "/models/chat/canary/history").json()["events"]]
        assert reasons[0] == "ship it"


def test_start_after_a_promote_is_409_and_traffic_stays_on_the_promoted():
    manual = {**CANARY, "auto_start": False, "interval_s": 60}
    with stack({"v1": [Behaviour("stable")], "canary": [Behaviour("c")]},
               weights={"v1": 1, "canary": 0}, model={"canary": manual}) as s:
        assert s.admin("POST", "/models/chat/canary/start").status_code == 200
        assert s.admin("POST", "/models/chat/canary/promote").json()["weight"] == 1.0
        r = s.admin("POST", "/models/chat/canary/start")
        assert r.status_code == 409 and "new canary" in r.json()["error"]["message"]
        models = s.admin("GET", "/models").json()["models"]
        assert {v["name"]: v["weight"] for v in models[0]["versions"]} == {"v1": 0.0, "canary": 1.0}


def test_an_elastic_canary_pool_with_no_ready_instance_is_not_judged():
    """A bad canary whose pool is cold (its controller could start one) is not
    rolled back for that: the interval is a skip, and its outcomes are set aside."""
    with stack({"v1": [Behaviour("stable", tokens=1)],
                "canary": [Behaviour("bad", tokens=1, error_rate=0.6, seed=1)]},
               weights={"v1": 1, "canary": 0}, model={"canary": CANARY}) as s:
        rt = s.gateway.models["chat"]
        pool = rt.pools["canary"]
        pool.can_grow = True
        for inst in pool.instances():
            pool.set_draining(inst.instance_id)  # on its way out: nothing ready
        deadline = time.monotonic() + 10
        while not any(e["action"] == "skip" for e in rt.canary.events()) and time.monotonic() < deadline:
            rt.tick(time.time() + 1.0)  # an interval is due at each call
        assert rt.canary.failed_checks == 0 and rt.canary.state.value == "progressing"
        skip = next(e for e in rt.canary.events() if e["action"] == "skip")
        assert skip["reason"].startswith("not judged: the canary pool has no ready instance")


def test_every_failed_attempt_counts_once_against_the_canary():
    """The gateway retries a failed attempt on the same version; each attempt is evidence
    (issue 36: counting only the final answer hid most of a faulty canary's errors)."""
    manual = {**CANARY, "interval_s": 60, "count_forced": True}
    with stack({"v1": [Behaviour("stable", tokens=1)],
                "canary": [Behaviour("bad", tokens=1, error_rate=1.0)]},
               weights={"v1": 1, "canary": 0}, model={"canary": manual},
               auth={"open_privileges": {"version_override": True}}) as s:
        r = s.chat(headers={"x-llmserve-version": "canary"})
        assert r.status_code == 500
        ev = s.gateway.models["chat"].canary.evidence["canary"]
        assert s.fakes["bad"].requests == 3  # three attempts, one client request
        assert (ev.requests, ev.errors) == (3, 3)
