"""The model's timeline in the admin API: both pools on one time axis through a live
canary rollout (weights moving, verdicts, instances), manual interventions, the download."""

import json
import time

from .app_harness import stack, wait_until
from .fake_upstream import Behaviour
from .test_app_canary import CANARY, _drive


def test_a_canary_rollout_is_one_timeline_of_both_pools_with_weights_verdicts_and_interventions():
    with stack({"v1": [Behaviour("stable", tokens=1)], "canary": [Behaviour("good", tokens=1)]},
               weights={"v1": 1, "canary": 0}, model={"canary": CANARY}) as s:
        s.gateway.timeline.interval_s = 0.05
        rt = s.gateway.models["chat"]
        time.sleep(1.1)  # (the first sample's sleep was the default second)
        _drive(s, lambda: rt.canary.state.value == "promoted")
        canary_id = s.gateway.pool("chat", "canary").instances()[0].instance_id
        assert s.admin("POST", f"/models/chat/versions/canary/instances/{canary_id}/drain").status_code == 200
        wait_until(lambda: s.gateway.timeline._samples["chat"][-1]["versions"]["canary"]["draining"] == 1,
                   what="a sample after the drain")
        r = s.admin("GET", "/models/chat/timeline", params={"download": "true"})
    assert r.status_code == 200 and r.headers["content-disposition"].startswith("attachment;")
    t = json.loads(r.content)
    assert t["model"] == "chat" and t["versions"] == ["v1", "canary"]
    samples = t["samples"]
    assert [s["time"] for s in samples] == sorted(s["time"] for s in samples) and len(samples) >= 3
    weights = [s["versions"]["canary"]["weight"] for s in samples]
    # The canary's share moved through its steps to all of the traffic, stable's the other way.
    assert weights[-1] == 1.0 and any(0 < w < 1 for w in weights)
    assert all(abs(s["versions"]["v1"]["weight"] + s["versions"]["canary"]["weight"] - 1) < 1e-9 for s in samples)
    assert samples[-1]["versions"]["v1"]["ready"] == 1 and samples[-1]["versions"]["canary"]["draining"] == 1
    actions = [e["action"] for e in t["canary"]["events"]]
    assert actions[0] == "start" and "advance" in actions and actions[-1] == "promote"
    assert t["canary"]["status"]["state"] == "promoted"
    assert [(i["version"], i["action"], i["reason"]) for i in t["interventions"]] == [
        ("canary", "instance_drain", canary_id)]


def test_an_admin_canary_action_is_an_intervention_and_since_filters():
    with stack({"v1": [Behaviour("stable")], "canary": [Behaviour("c")]}, weights={"v1": 1, "canary": 0},
               model={"canary": {**CANARY, "interval_s": 60}}) as s:
        start = time.time()
        assert s.admin("POST", "/models/chat/canary/pause", json={"reason": "looking at logs"}).status_code == 200
        t = s.admin("GET", "/models/chat/timeline").json()
        assert [(i["action"], i["reason"]) for i in t["interventions"]] == [("canary_pause", "looking at logs")]
        assert [e["action"] for e in t["canary"]["events"]][-1] == "pause"
        later = s.admin("GET", "/models/chat/timeline", params={"since": time.time()}).json()
        assert later["interventions"] == [] and later["canary"]["events"] == [] and later["since"] > start
        assert s.admin("GET", "/models/nope/timeline").status_code == 404


def test_a_since_that_is_not_a_finite_number_is_a_400_not_invalid_json():
    with stack({"v1": [Behaviour("stable")], "canary": [Behaviour("c")]}, weights={"v1": 1, "canary": 0},
               model={"canary": {**CANARY, "interval_s": 60}}) as s:
        for bad in ("nan", "inf", "-inf", "abc"):
            r = s.admin("GET", "/models/chat/timeline", params={"since": bad})
            assert r.status_code == 400, (bad, r.status_code, r.text)
            json.loads(r.text)  # strict JSON: no NaN or Infinity literals
