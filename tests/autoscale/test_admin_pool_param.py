"""The autoscale admin API takes the pool as ``?pool=``, as its docs and its own 400 say."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from .fakes import FakeProvider
from .test_deployment import AUTH, two_pools as two_pools_of


def two_pools():
    app, _ = two_pools_of(FakeProvider(initial_state="ready", url_template="http://127.0.0.1:9/{id}"))
    return app


def test_pool_query_parameter_picks_the_pool():
    with TestClient(two_pools()) as client:
        r = client.get("/admin/autoscale/pools?pool=chat/v9", headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == "pool_not_found"
        r = client.get("/admin/autoscale/pools?pool=chat/v1", headers=AUTH)
        assert r.status_code == 200 and [p["pool"] for p in r.json()["pools"]] == ["chat/v1"]
        assert len(client.get("/admin/autoscale/pools", headers=AUTH).json()["pools"]) == 2

        body = {"instances": 1, "duration_s": 5}
        r = client.post("/admin/autoscale/scale?pool=chat/v1", headers=AUTH, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["pool"] == "chat/v1" and r.json()["override"] is not None
        r = client.post("/admin/autoscale/scale", headers=AUTH, json={**body, "pool": "chat/v2"})
        assert r.status_code == 200 and r.json()["pool"] == "chat/v2"  # the body still works
        r = client.post("/admin/autoscale/scale?pool=chat/v1", headers=AUTH, json={**body, "pool": "chat/v1"})
        assert r.status_code == 200  # both, the same: fine
        r = client.post("/admin/autoscale/scale?pool=chat/v1", headers=AUTH, json={**body, "pool": "chat/v2"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "pool_conflict"
        r = client.post("/admin/autoscale/scale?pool=chat/v9", headers=AUTH, json=body)
        assert r.status_code == 404
        r = client.post("/admin/autoscale/scale", headers=AUTH, json=body)
        assert r.status_code == 400 and "?pool=" in r.json()["error"]["message"]
