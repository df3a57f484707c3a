"""The autoscale admin API, metrics and dashboard data on the real gateway app, with a
fake provider (instances that are "ready" at once and never take real traffic)."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from llmserve.serve.serve import build_app
from llmserve.serve.serve_config import ServeConfig

from .fakes import FakeProber, FakeProvider

KEY = "admin-key-for-autoscale-tests-0123"
AUTH = {"authorization": f"Bearer {KEY}"}


def wait_for(client, predicate, timeout=10.0, what=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pools = client.get("/admin/autoscale/pools", headers=AUTH).json()["pools"]
        if predicate(pools[0]):
            return pools[0]
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {pools}")


@pytest.fixture
def served():
    cfg = ServeConfig(model="/models/tiny", served_model_name="tiny",
                      autoscale={"policy": "static", "static": {"instances": 1}, "tick_s": 0.1},
                      lifecycle={"probe_interval_s": 0.05, "unready_grace_s": 600.0},
                      gateway={"polling": {"load_interval_s": 0.5, "ready_interval_s": 5.0, "timeout_s": 0.2}})
    # Port 9 (discard) refuses connections: the gateway's monitor cannot reach the fakes,
    # which is fine here; nothing is proxied.
    provider = FakeProvider(initial_state="ready", url_template="http://127.0.0.1:9/{id}")
    app, controller = build_app(cfg, provider, KEY, prober=FakeProber(provider))
    with TestClient(app) as client:
        yield client, controller, provider


def test_admin_api_needs_the_key(served):
    client, _, _ = served
    assert client.get("/admin/autoscale/pools").status_code == 401
    assert client.get("/admin/autoscale/pools", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/admin/dashboard/data").status_code == 401
    assert client.get("/dashboard").status_code == 200  # the page itself holds no data


def test_pools_instances_events_decisions_and_manual_scaling(served):
    client, controller, provider = served
    pool = wait_for(client, lambda p: p["counts"]["ready"] == 1, what="one ready instance")
    assert pool["pool"] == "tiny/v1" and pool["policy"] == "static" and pool["provider"] == "fake"
    inst = client.get("/admin/autoscale/instances", headers=AUTH).json()["instances"]
    assert [(i["instance_id"], i["state"], i["in_pool"]) for i in inst] == [("v1-1", "ready", True)]
    assert provider.specs[0].engine_args[:6] == ("--model", "/models/tiny", "--served-model-name", "tiny",
                                                 "--threads", provider.specs[0].engine_args[5])

    sd = client.get("/admin/autoscale/targets", headers=AUTH).json()
    assert sd == [{"targets": ["127.0.0.1:9"], "labels": {"model": "tiny", "version": "v1", "instance": "v1-1",
                                                         "lifecycle_state": "ready"}}]
    r = client.post("/admin/autoscale/scale", headers=AUTH, json={"instances": 2, "reason": "load test"})
    assert r.status_code == 200 and r.json()["override"]["instances"] == 2
    wait_for(client, lambda p: p["counts"]["ready"] == 2, what="two ready instances")

    events = client.get("/admin/autoscale/events", headers=AUTH).json()["events"]
    new = [(e["old"], e["new"]) for e in events if e["instance_id"] == "v1-2" and e["kind"] == "transition"]
    assert new == [(None, "starting"), ("starting", "warming"), ("warming", "ready")]
    assert all(e["time"] > 0 and e["reason"] for e in events)
    since = events[-1]["seq"]
    assert client.get(f"/admin/autoscale/events?since={since}", headers=AUTH).json()["events"] == []

    changes = client.get("/admin/autoscale/decisions?changes_only=true", headers=AUTH).json()["decisions"]
    assert changes[-1]["source"] == "manual" and "load test" in changes[-1]["reason"]
    assert changes[-1]["provisioned"] == 1 and changes[-1]["desired"] == 2

    assert client.post("/admin/autoscale/scale", headers=AUTH, json={"instances": 99}).status_code == 400
    assert client.post("/admin/autoscale/scale", headers=AUTH, json={"instances": -1}).status_code == 400
    assert client.post("/admin/autoscale/scale", headers=AUTH,
                       json={"instances": 1, "pool": "nope/v9"}).status_code == 404
    r = client.post("/admin/autoscale/scale", headers=AUTH, json={"instances": None, "reason": "done"})
    assert r.status_code == 200 and r.json()["override"] is None
    wait_for(client, lambda p: p["counts"]["ready"] == 1 and p["counts"]["draining"] == p["counts"]["stopping"] == 0,
             what="back to one")

    metrics = client.get("/metrics").text
    assert 'llmserve:autoscale_manual_interventions_total{action="scale",model="tiny",version="v1"} 1.0' in metrics
    assert 'llmserve:autoscale_manual_interventions_total{action="clear",model="tiny",version="v1"} 1.0' in metrics
    assert 'llmserve:autoscale_instances{model="tiny",state="ready",version="v1"} 1.0' in metrics
    for old, new in (("draining", "stopping"), ("stopping", "stopped")):
        assert (f'llmserve:autoscale_transitions_total{{from_state="{old}",model="tiny",to_state="{new}",version="v1"}} 1.0'
                in metrics)
    assert 'llmserve:autoscale_instances{model="tiny",state="stopping",version="v1"} 0.0' in metrics
    assert "llmserve:autoscale_cold_start_seconds_bucket" in metrics
    assert "llmserve:autoscale_instance_seconds_total" in metrics

    timeline = client.get("/admin/autoscale/timeline", headers=AUTH).json()["samples"]
    assert timeline and {"ready", "desired", "arrival_rate", "queued", "ttft_p99"} <= set(timeline[-1])


def test_dashboard_page_and_data(served):
    client, controller, _ = served
    wait_for(client, lambda p: p["counts"]["ready"] == 1, what="one ready instance")
    page = client.get("/dashboard")
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    for marker in ('id="chart-instances"', 'id="chart-load"', 'id="chart-latency"', 'id="instances-table"',
                   'id="events"', 'id="canary"', "/admin/dashboard/data"):
        assert marker in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from elsewhere
    data = client.get("/admin/dashboard/data", headers=AUTH).json()
    assert data["models"][0]["name"] == "tiny"
    auto = data["autoscale"][0]
    assert auto["pool"] == "tiny/v1" and auto["instances"][0]["state"] == "ready"
    assert auto["timeline"] and auto["events"]


def test_serve_config_is_validated_at_start():
    with pytest.raises(ValueError, match=r"autoscale\.bounds\.min_instance\n"):
        ServeConfig(autoscale={"bounds": {"min_instance": 1}})
    with pytest.raises(ValueError, match=r"lifecycle\.drain_timeout\n"):
        ServeConfig(lifecycle={"drain_timeout": 3})
    with pytest.raises(ValueError, match=r"pool\.admision\n"):
        ServeConfig(pool={"admision": {}})
    with pytest.raises(ValueError, match="engine_args"):
        ServeConfig(engine_args=["--port", "9000"])
    with pytest.raises(ValueError):
        ServeConfig(gateway={"models": []})
    with pytest.raises(ValueError):
        ServeConfig(port=0)
    cfg = ServeConfig(model="/x/SmolLM2.gguf", cold_start_delay_s=2.5, threads_per_instance=3,
                      engine_args=["--max-num-seqs", "8"])
    spec = cfg.instance_spec("v1-7")
    assert cfg.served_name == "SmolLM2"
    assert spec.engine_args == ("--model", "/x/SmolLM2.gguf", "--served-model-name", "SmolLM2", "--threads", "3",
                                "--instances", str(cfg.most_instances()), "--startup-delay", "2.5",
                                "--max-num-seqs", "8")
    assert cfg.most_instances() == cfg.autoscale_config().bounds.max_instances  # one pool
    assert cfg.autoscale_config().policy == "predictive"  # the default policy


def test_the_grafana_dashboard_and_docs_name_metrics_that_exist(served):
    """Every llmserve:autoscale_* series the Grafana dashboard queries is exported."""
    import json
    import re
    from pathlib import Path

    client, _, _ = served
    wait_for(client, lambda p: p["counts"]["ready"] == 1, what="one ready instance")
    exported = set(re.findall(r"^(llmserve:autoscale_[a-z_]+)", client.get("/metrics").text, re.M))
    root = Path(__file__).resolve().parents[2]
    dash = json.loads((root / "docs" / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    wanted = set(re.findall(r"llmserve:autoscale_[a-z_]+", exprs))
    wanted |= set(re.findall(r"llmserve:autoscale_[a-z_]+", (root / "docs" / "autoscaling.md").read_text()))
    # A histogram or counter may be named by its family (no _bucket/_sum/_count/_total).
    families = {re.sub(r"_(bucket|sum|count|total|created)$", "", e) for e in exported}
    assert wanted and wanted - exported - families == set()


def test_serve_flags_override_the_yaml(tmp_path):
    from llmserve.serve.serve import overrides_from_args
    from llmserve.cli import build_parser

    cfg_file = tmp_path / "serve.yaml"
    cfg_file.write_text("port: 9100\nmodel: /m/a\nautoscale: {policy: kpa, bounds: {max_instances: 5}}\n"
                        "engine_args: ['--max-num-seqs', '2']\n")
    args = build_parser(["serve"]).parse_args(["serve", "--config", str(cfg_file), "--port", "9200", "--min-instances", "2",
                                      "--engine-args", "--max-num-seqs 8 --dtype bf16", "--provider", "ray",
                                      "--cold-start-delay", "1.5"])
    cfg = ServeConfig.load(args.config, overrides_from_args(args))
    auto = cfg.autoscale_config()
    assert (cfg.port, cfg.model, cfg.provider.kind, cfg.cold_start_delay_s) == (9200, "/m/a", "ray", 1.5)
    assert (auto.policy, auto.bounds.min_instances, auto.bounds.max_instances) == ("kpa", 2, 5)
    assert cfg.engine_args == ["--max-num-seqs", "8", "--dtype", "bf16"]
    plain = ServeConfig.load(None, overrides_from_args(build_parser(["serve"]).parse_args(["serve"])))
    assert (plain.port, plain.model, plain.provider.kind) == (8000, "SmolLM2-135M-Instruct", "local")


def test_scale_refuses_durations_that_never_end_or_are_not_numbers(served):
    client, _, _ = served
    for bad in ("Infinity", "-Infinity", "NaN", "0", "-5"):
        r = client.post("/admin/autoscale/scale", headers={**AUTH, "content-type": "application/json"},
                        content=f'{{"instances": 1, "duration_s": {bad}}}')
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert r.json()["error"]["code"] == "invalid_request" and "duration_s" in r.json()["error"]["message"]
    assert client.get("/admin/autoscale/pools", headers=AUTH).json()["pools"][0]["override"] is None


def test_a_replaced_override_is_recorded_as_the_old_value(served):
    client, _, _ = served
    for n in (2, 1):
        assert client.post("/admin/autoscale/scale", headers=AUTH, json={"instances": n}).status_code == 200
    assert client.post("/admin/autoscale/scale", headers=AUTH, json={"instances": None}).status_code == 200
    events = client.get("/admin/autoscale/events", headers=AUTH).json()["events"]
    assert [(e["old"], e["new"]) for e in events if e["kind"] == "override"] == [
        (None, "2"), ("2", "1"), ("1", "cleared")]


@pytest.mark.parametrize("method, path, body, param, says", [
    ("post", "/admin/autoscale/scale", {"instances": -1}, "instances",
     "instances: Input should be greater than or equal to 0, got -1"),
    ("post", "/admin/autoscale/scale", {"instances": 1, "bogus": 2}, "bogus", "bogus: Extra inputs are not permitted"),
    ("post", "/admin/autoscale/scale", {}, "instances", "instances: Field required"),
    ("get", "/admin/autoscale/events?since=abc", None, "since", "since: Input should be a valid integer"),
    ("get", "/admin/autoscale/events?limit=-1", None, "limit", "limit: Input should be greater than or equal to 1"),
    ("get", "/admin/autoscale/decisions?limit=0", None, "limit", "limit: Input should be greater than or equal to 1"),
    ("get", "/admin/autoscale/timeline?since=nan", None, "since", "since: Input should be a finite number"),
])
def test_a_bad_admin_request_is_a_400_naming_its_field(served, method, path, body, param, says):
    """As the /v1 API's refusals: the field as param and in the message, not pydantic's list
    as a Python repr; a limit below one is refused, not an empty answer."""
    client, _, _ = served
    r = client.request(method, path, headers=AUTH, json=body)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "invalid_request" and err["param"] == param, r.text
    assert err["message"].startswith(says) and "'loc'" not in err["message"], err["message"]


def test_a_malformed_admin_body_is_a_400_saying_so(served):
    client, _, _ = served
    r = client.post("/admin/autoscale/scale", headers={**AUTH, "content-type": "application/json"}, content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["message"] == "malformed JSON in the request body"


@pytest.mark.parametrize("autoscale, ready", [
    ({"bounds": {"min_instances": 0, "max_instances": 2}}, True),
    ({"bounds": {"min_instances": 1, "max_instances": 2}}, False),
    ({"bounds": {"min_instances": 0, "max_instances": 2}, "capacity": {"on_demand": {"min_instances": 1}}}, False),
    ({"policy": "static", "static": {"instances": 0}, "bounds": {"min_instances": 0}}, True),
])
def test_a_deployment_that_rests_at_zero_is_ready_with_no_instance(autoscale, ready):
    """Scaled to zero by design, serve starts an instance for the first request (it queues):
    a load balancer that checks /ready (docs/replicas.md) must be let send it. A pool with a
    floor keeps /ready at 503 until an instance is ready, as before."""
    cfg = ServeConfig(model="/models/tiny", served_model_name="tiny", autoscale={"tick_s": 0.1, **autoscale},
                      lifecycle={"probe_interval_s": 0.05})
    provider = FakeProvider(initial_state="starting", url_template="http://127.0.0.1:9/{id}")  # never ready
    app, _ = build_app(cfg, provider, KEY, prober=FakeProber(provider))
    with TestClient(app) as client:
        r = client.get("/ready")
        assert (r.status_code == 200) is ready, r.text


def test_the_gateways_instance_api_leaves_a_controlled_pool_to_its_controller(served):
    """Under serve, DELETE .../instances/{id} took a ready instance out of the gateway's pool
    while its controller went on counting it ready (and billing it): the pool had nothing
    to route to and was never refilled. A 409 points at the autoscale API instead."""
    client, _, _ = served
    pool = wait_for(client, lambda p: p["counts"]["ready"] == 1, what="one ready instance")
    [inst] = client.get("/admin/autoscale/instances", headers=AUTH).json()["instances"]
    base = "/admin/models/tiny/versions/v1/instances"
    for method, path, body in (("delete", f"{base}/{inst['instance_id']}", None),
                               ("post", f"{base}/{inst['instance_id']}/drain", None),
                               ("post", base, {"url": "http://127.0.0.1:9/extra"})):
        r = client.request(method, path, headers=AUTH, json=body)
        assert r.status_code == 409 and r.json()["error"]["code"] == "controlled_pool", r.text
        assert "/admin/autoscale/scale" in r.json()["error"]["message"]
    listed = client.get(base, headers=AUTH).json()["instances"]
    assert [i["instance_id"] for i in listed] == [inst["instance_id"]] and not listed[0]["draining"]
    assert pool["counts"]["ready"] == 1
