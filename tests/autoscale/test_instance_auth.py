"""Where Ray-hosted engines listen and the key a pool's instances require: pure
decisions, and that serve hands the key to the instances, the gateway and the probes."""

from __future__ import annotations

import itertools
import time

import pytest
from fastapi.testclient import TestClient

from llmserve.autoscale.providers.ray import engine_host
from llmserve.serve.serve import build_app
from llmserve.serve.serve_config import ServeConfig

from .fakes import FakeProvider


@pytest.mark.parametrize("bind_host,address,host", [
    (None, None, "127.0.0.1"),  # the runtime connect() starts on this machine
    (None, "127.0.0.1:6379", "127.0.0.1"),
    (None, "localhost:6379", "127.0.0.1"),
    (None, "ray://localhost:10001", "127.0.0.1"),
    (None, "ray://127.0.0.1:10001", "127.0.0.1"),
    (None, "[::1]:6379", "127.0.0.1"),
    (None, "auto", None),  # may be a cluster of many nodes: each node's own address
    (None, "ray://head.example:10001", None),
    (None, "10.0.0.5:6379", None),
    ("0.0.0.0", None, "0.0.0.0"),  # configured wins
    ("10.1.2.3", "auto", "10.1.2.3"),
])
def test_engine_host(bind_host, address, host):
    assert engine_host(bind_host, address) == host


def test_the_instance_key_is_generated_for_ray_only_unless_configured():
    keys = (f"generated-{i}" for i in itertools.count())
    ray = ServeConfig(provider={"kind": "ray"})
    assert ray.instance_key(lambda: next(keys)) == "generated-0"
    assert ray.instance_key(lambda: next(keys)) == "generated-1"  # one per call: per pool
    assert ServeConfig().instance_key(lambda: next(keys)) is None  # local: loopback subprocesses
    assert ServeConfig(instance_api_key="configured-key").instance_key(lambda: "x") == "configured-key"
    assert ServeConfig(provider={"kind": "ray"}).instance_key() != ServeConfig(provider={"kind": "ray"}).instance_key()
    with pytest.raises(ValueError):
        ServeConfig(instance_api_key="short")
    with pytest.raises(ValueError, match="engine_args"):
        ServeConfig(engine_args=["--api-key", "k"])


def test_the_key_goes_to_the_spec_environment_and_the_gateway_upstreams():
    cfg = ServeConfig(model="/models/tiny", served_model_name="tiny")
    spec = cfg.instance_spec("v1-1", instance_key="pool-key-0123")
    assert dict(spec.env) == {"LLMSERVE_API_KEY": "pool-key-0123", "VLLM_API_KEY": "pool-key-0123"}
    assert "pool-key-0123" not in spec.engine_args  # not in argv, where ps shows it
    assert dict(cfg.instance_spec("v1-1").env) == {"LLMSERVE_API_KEY": "", "VLLM_API_KEY": ""}  # none inherited
    version = cfg.gateway_config("x" * 16, "pool-key-0123").models[0].versions[0]
    assert version.api_key.get_secret_value() == "pool-key-0123"
    assert cfg.gateway_config("x" * 16).models[0].versions[0].api_key is None


def test_serve_with_ray_gives_its_pool_one_key_everywhere():
    cfg = ServeConfig(model="/models/tiny", served_model_name="tiny", provider={"kind": "ray"},
                      autoscale={"policy": "static", "static": {"instances": 1}, "tick_s": 0.1},
                      lifecycle={"probe_interval_s": 0.05, "unready_grace_s": 600.0},
                      gateway={"polling": {"load_interval_s": 0.5, "ready_interval_s": 5.0, "timeout_s": 0.2}})
    # Port 9 refuses connections: the real HTTP prober probes, and nothing becomes ready.
    provider = FakeProvider(initial_state="ready", url_template="http://127.0.0.1:9/{id}")
    app, controller = build_app(cfg, provider, "admin-key-for-autoscale-tests-0123")
    with TestClient(app):
        controller_key = controller._client.headers["authorization"]  # the probes' client
        gateway_key = app.state.gateway.models["tiny"].upstream_auth["v1"]
        deadline = time.monotonic() + 10
        while not provider.specs and time.monotonic() < deadline:
            time.sleep(0.02)
        spec_key = dict(provider.specs[0].env)["LLMSERVE_API_KEY"]
    assert len(spec_key) >= 24
    assert controller_key == gateway_key == f"Bearer {spec_key}"
