"""The admin API: its key, and the run-time pool interface (add, drain, remove)."""

from .app_harness import ADMIN_KEY, instance_of, stack, wait_until
from .fake_upstream import Behaviour, ServerThread, make_app


def test_admin_needs_the_admin_key():
    with stack({"v1": [Behaviour("a")]}) as s:
        assert s.client.get("/admin/pools").status_code == 401
        r = s.client.get("/admin/pools", headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
        r = s.client.get("/admin/pools", headers={"x-admin-key": ADMIN_KEY})
        assert r.status_code == 200
        pool = r.json()["pools"][0]
        assert pool["model"] == "chat" and pool["version"] == "v1"
        assert pool["instances"][0]["ready"] is True
        assert set(pool["queues"]) == {"realtime", "batch"}


def test_admin_api_is_off_without_an_admin_key():
    with stack({"v1": [Behaviour("a")]}, auth={"admin_key": None}) as s:
        r = s.client.get("/admin/pools", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status_code == 404


def test_add_drain_and_remove_instances_at_run_time():
    extra = Behaviour("extra", tokens=1)
    srv = ServerThread(make_app(extra)).start()
    try:
        with stack({"v1": [Behaviour("a", tokens=1)]}) as s:
            r = s.admin("POST", "/models/chat/versions/v1/instances",
                        json={"url": srv.url, "instance_id": "extra-1"})
            assert r.status_code == 201, r.text
            assert s.admin("POST", "/models/chat/versions/v1/instances",
                           json={"url": srv.url}).status_code == 400  # already there
            pool = s.gateway.pool("chat", "v1")
            wait_until(lambda: pool.get("extra-1").ready, what="added instance ready")
            for i in range(30):
                s.chat(f"q{i}")
            assert extra.requests > 0

            r = s.admin("POST", "/models/chat/versions/v1/instances/extra-1/drain")
            assert r.json() == {"instance_id": "extra-1", "draining": True}
            before = extra.requests
            assert all(instance_of(s.chat(f"d{i}")) != "extra-1" for i in range(10))
            assert extra.requests == before

            assert s.admin("DELETE",
                           "/models/chat/versions/v1/instances/extra-1").status_code == 200
            ids = [i["instance_id"] for i in
                   s.admin("GET", "/models/chat/versions/v1/instances").json()["instances"]]
            assert "extra-1" not in ids
            assert s.admin("DELETE",
                           "/models/chat/versions/v1/instances/extra-1").status_code == 404
            assert s.admin("GET", "/models/chat/versions/v9/instances").status_code == 404
    finally:
        srv.stop(force=True)


def test_a_model_named_with_a_slash_is_administered(tmp_path):
    """vLLM serves a Hugging Face id as it is (``Qwen/Qwen2.5-0.5B-Instruct``): its canary,
    instances and timeline were a 404 ``Not Found``, so a rollout could not be driven by hand."""
    with _canary_admin(tmp_path, "org/m") as c:
        for name in ("org/m", "org%2Fm"):
            assert c.get(f"/admin/models/{name}/canary").json()["state"] == "idle"
            assert c.get(f"/admin/models/{name}/canary/history").status_code == 200
            assert c.get(f"/admin/models/{name}/timeline").json()["model"] == "org/m"
            assert c.get(f"/admin/models/{name}/versions/v1/instances").json() == {"instances": []}
        assert c.post("/admin/models/org/m/canary/start").json()["state"] == "progressing"
        assert c.post("/admin/models/org/m/canary/rollback").json()["state"] == "rolled_back"
        r = c.post("/admin/models/org/m/versions/v1/instances", json={"url": "http://127.0.0.1:9", "instance_id": "x"})
        assert r.status_code == 201, r.text
        assert c.post("/admin/models/org/m/versions/v1/instances/x/drain").json()["draining"] is True
        assert c.delete("/admin/models/org/m/versions/v1/instances/x").json() == {"removed": "x"}
        assert c.get("/admin/models/org/n/canary").json()["error"]["code"] == "model_not_found"


def test_a_canary_actions_reason_is_bounded_and_a_form_body_is_named(tmp_path):
    """The reason is kept in the rollout's history (up to history_size entries): a 4 MiB one
    each time was memory an admin script could fill by mistake; a scale's is capped alike."""
    with _canary_admin(tmp_path, "m") as c:
        r = c.post("/admin/models/m/canary/start", json={"reason": "a" * 501})
        assert r.status_code == 400 and r.json()["error"]["param"] == "reason", r.text
        r = c.post("/admin/models/m/canary/start", content=b"reason=x",
                   headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 400 and r.json()["error"]["message"].endswith('got "reason=x"'), r.text
        assert c.post("/admin/models/m/canary/start", json={"reason": "a" * 500}).status_code == 200
        assert c.get("/admin/models/m/canary/history").json()["events"][0]["reason"] == "a" * 500


def _canary_admin(tmp_path, name: str):
    """A gateway with no instances whose model ``name`` has a canary (v2 over v1), not started:
    its test client, with the admin key."""
    from fastapi.testclient import TestClient

    from llmserve.gateway.app import create_app
    from llmserve.gateway.config import GatewayConfig

    cfg = GatewayConfig.model_validate({
        "models": [{"name": name, "versions": [{"name": "v1", "weight": 1, "upstreams": []},
                                               {"name": "v2", "weight": 0, "upstreams": []}],
                    "canary": {"version": "v2", "stable": "v1", "auto_start": False}}],
        "auth": {"admin_key": ADMIN_KEY}, "state": {"dir": str(tmp_path)}})
    c = TestClient(create_app(cfg))
    c.headers["authorization"] = f"Bearer {ADMIN_KEY}"
    return c
