"""A controlled pool on its model's timeline: the controller's instances by state, its
scaling decisions with their reasons, and a manual override as an intervention."""

from __future__ import annotations

from .test_admin import AUTH, served, wait_for  # noqa: F401 (the fixture)


def test_a_controlled_pool_brings_its_states_decisions_and_overrides_to_the_timeline(served):  # noqa: F811
    client, controller, _ = served
    wait_for(client, lambda p: p["counts"]["ready"] == 1, what="one ready instance")
    assert client.post("/admin/autoscale/scale", headers=AUTH,
                       json={"instances": 2, "reason": "load test at noon"}).status_code == 200
    wait_for(client, lambda p: p["counts"]["ready"] == 2, what="the second instance")
    wait_for(client, lambda p: len(controller.history.samples()) and controller.history.samples()[-1]["ready"] == 2,
             what="a tick that saw it")
    t = client.get("/admin/models/tiny/timeline", headers=AUTH).json()
    pool = t["controllers"]["v1"]
    readies = [s["ready"] for s in pool["samples"]]
    assert readies[-1] == 2 and 1 in readies and all({"warming", "starting", "desired"} <= set(s) for s in pool["samples"])
    assert any(d["desired"] == 2 and d["source"] == "manual" for d in pool["decisions"])
    assert [(i["version"], i["action"]) for i in t["interventions"]] == [("v1", "scale_override")]
    assert "load test at noon" in t["interventions"][0]["reason"]
    data = client.get("/admin/dashboard/data", headers=AUTH).json()
    assert [x["model"] for x in data["timelines"]] == ["tiny"] and data["timelines"][0]["controllers"]["v1"]["samples"]

