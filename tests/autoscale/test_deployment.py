"""``models:`` deployments in ``llmserve serve``'s config: validation (errors name the
key), the pools they resolve to, and one controller per pool on the real gateway app."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from llmserve.serve.serve import build_deployment
from llmserve.serve.serve_config import ServeConfig

from .fakes import FakeProber, FakeProvider

KEY = "admin-key-for-autoscale-tests-0123"
AUTH = {"authorization": f"Bearer {KEY}"}


def deployment(**over) -> dict:
    d = {"autoscale": {"policy": "static", "static": {"instances": 1}, "tick_s": 0.1,
                       "bounds": {"min_instances": 1, "max_instances": 3}},
         "models": [{"name": "chat", "versions": [
             {"name": "v1", "model": "/models/a", "engine_args": ["--max-num-seqs", "16"]},
             {"name": "v2", "model": "/models/b.gguf",
              "autoscale": {"bounds": {"min_instances": 0, "max_instances": 1}}}],
             "canary": {"version": "v2", "stable": "v1", "start_weight": 0.05, "step_weight": 0.1,
                        "max_weight": 0.5}}]}
    d.update(over)
    return d


def error_of(data: dict) -> str:
    with pytest.raises(ValidationError) as e:
        ServeConfig.model_validate(data)
    return str(e.value)


def test_pools_resolve_defaults_weights_and_flags():
    cfg = ServeConfig.model_validate(deployment(engine_args=["--max-num-seqs", "4"], threads_per_instance=None))
    v1, v2 = cfg.pools()
    assert (v1.key, v1.source, v1.weight) == ("chat/v1", "/models/a", 1.0)
    assert (v2.key, v2.source, v2.weight) == ("chat/v2", "/models/b.gguf", 0.0)  # the canary's weight: its own
    assert v1.engine_args == ("--max-num-seqs", "4", "--max-num-seqs", "16")  # the version's flags come last
    assert cfg.autoscale_config(v1).bounds.max_instances == 3
    b2 = cfg.autoscale_config(v2).bounds
    assert (b2.min_instances, b2.max_instances) == (0, 1)
    assert cfg.autoscale_config(v2).policy == "static"  # the top level is every pool's default
    spec = cfg.instance_spec("chat-v2-1", pool=v2)
    assert spec.engine_args[:4] == ("--model", "/models/b.gguf", "--served-model-name", "chat")
    gw = cfg.gateway_config("x" * 16)
    model = gw.models[0]
    assert [v.name for v in model.versions] == ["v1", "v2"] and model.canary.version == "v2"
    assert model.stickiness_window_s == 600.0


def test_instances_start_on_every_core_and_are_shared_out_unless_a_pool_sets_its_own(monkeypatch):
    monkeypatch.setattr("llmserve.engine.threads.available_cores", lambda: 16)
    cfg = ServeConfig.model_validate(deployment())
    v1, v2 = cfg.pools()
    # An instance starts with the machine's cores; CoreShare then gives each its share.
    assert cfg.threads(v1) == cfg.threads(v2) == 16
    assert cfg.shares_cores(v1) and cfg.shares_cores(v2)
    data = deployment()
    data["models"][0]["versions"][1]["threads_per_instance"] = 2
    cfg = ServeConfig.model_validate(data)
    assert cfg.threads(cfg.pools()[1]) == 2 and cfg.threads(cfg.pools()[0]) == 16
    assert cfg.shares_cores(cfg.pools()[0]) and not cfg.shares_cores(cfg.pools()[1])
    assert not ServeConfig.model_validate({**deployment(), "provider": {"kind": "ray"}}).shares_cores(v1)


def test_single_model_keys_are_a_one_version_deployment():
    cfg = ServeConfig(model="/models/tiny", served_model_name="tiny", version="blue")
    (p,) = cfg.pools()
    assert (p.key, p.source, p.weight) == ("tiny/blue", "/models/tiny", 1.0)
    assert cfg.gateway_config("x" * 16).models[0].stickiness_window_s == 0.0  # unchanged: pure hashing


@pytest.mark.parametrize("change, key", [
    (lambda d: d.update(model="/models/x"), "model: with models"),
    (lambda d: d.update(version="v9"), "version: with models"),
    (lambda d: d["models"][0]["versions"][1]["autoscale"].update(bounds={"min_instances": -1}),
     "models[chat].versions[v2].autoscale"),
    (lambda d: d["models"][0]["versions"][1]["autoscale"].update(polcy="kpa"), "models[chat].versions[v2].autoscale"),
    (lambda d: d["models"][0]["versions"][0].update(engine_args=["--port", "1"]), "engine_args"),
    (lambda d: d["models"][0]["versions"][0].update(modle="x"), "modle"),
    (lambda d: d["models"][0]["versions"].append({"name": "v1", "model": "/m"}), "names must be unique"),
    (lambda d: d["models"][0]["canary"].update(version="v3"), "canary version 'v3'"),
    (lambda d: d["models"][0]["versions"][1].update(weight=5), "give it weight 0"),
    (lambda d: d["models"].append({"name": "chat", "versions": [{"name": "v1", "model": "/m"}]}),
     "models: names must be unique"),
])
def test_config_errors_name_the_key(change, key):
    data = deployment()
    change(data)
    assert key in error_of(data)


def test_capacity_classes_are_per_pool_over_the_top_level():
    data = deployment()
    data["autoscale"]["capacity"] = {"spot": {"max_instances": 2, "price_per_hour": 0.3}}
    data["models"][0]["versions"][1]["autoscale"]["capacity"] = {"spot": {"max_instances": 0}}
    cfg = ServeConfig.model_validate(data)
    v1, v2 = (cfg.autoscale_config(p).capacity for p in cfg.pools())
    assert v1.spot_enabled and v1.spot.price_per_hour == 0.3
    assert not v2.spot_enabled and v2.spot.price_per_hour == 0.3  # merged: only max_instances changed
    data["models"][0]["versions"][1]["autoscale"]["capacity"] = {"spot": {"min_instances": 1, "max_instances": 1}}
    assert "models[chat].versions[v2].autoscale" in error_of(data)


def two_pools(provider):
    """The two-pool deployment over ``provider``, probed at once: (app, controllers)."""
    cfg = ServeConfig.model_validate(deployment(
        lifecycle={"probe_interval_s": 0.05, "unready_grace_s": 600.0},
        gateway={"polling": {"load_interval_s": 0.5, "ready_interval_s": 5.0, "timeout_s": 0.2}}))
    return build_deployment(cfg, provider, KEY, prober=FakeProber(provider))


def test_one_controller_per_pool_sharing_the_provider():
    provider = ClosingLast(initial_state="ready", url_template="http://127.0.0.1:9/{id}")
    app, controllers = two_pools(provider)
    assert [c.key for c in controllers] == ["chat/v1", "chat/v2"]
    assert all(c.provider is provider for c in controllers)
    with TestClient(app) as client:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pools = client.get("/admin/autoscale/pools", headers=AUTH).json()["pools"]
            if [p["counts"]["ready"] for p in pools] == [1, 1]:
                break
            time.sleep(0.05)
        assert [p["pool"] for p in pools] == ["chat/v1", "chat/v2"]
        assert [p["counts"]["ready"] for p in pools] == [1, 1]
        ids = sorted(i["instance_id"] for i in client.get("/admin/autoscale/instances", headers=AUTH).json()["instances"])
        assert ids == ["v1-1", "v2-1"]
        data = client.get("/admin/dashboard/data", headers=AUTH).json()
        assert len(data["autoscale"]) == 2
        r = client.post("/admin/autoscale/scale", headers=AUTH, json={"instances": 0, "reason": "t"})
        assert r.status_code == 400  # two pools: name one
    # The shared provider is closed once, after every pool stopped its instances.
    assert provider.stops_when_closed == [["v2-1", "v1-1"]]


class ClosingLast(FakeProvider):
    stops_when_closed: list

    async def close(self) -> None:
        self.__dict__.setdefault("stops_when_closed", []).append(list(self.stops))
        await super().close()


FOREIGN = {"name": "ext", "model": "Qwen/Qwen2-0.5B", "command": "vllm serve {model} --host {host} --port {port}"}


def test_a_command_version_is_a_pool_of_foreign_servers():
    data = deployment()
    data["models"][0]["versions"].append(FOREIGN)
    cfg = ServeConfig.model_validate(data)
    ext = cfg.pools()[2]
    assert ext.command == ("vllm", "serve", "Qwen/Qwen2-0.5B", "--host", "{host}", "--port", "{port}")
    assert (ext.ready_path, ext.load_source, ext.upstream_model) == ("/health", "metrics", "Qwen/Qwen2-0.5B")
    spec = cfg.instance_spec("ext-1", pool=ext)
    assert spec.command == ext.command and spec.engine_args == ()
    assert cfg.gateway_config("x" * 16).models[0].versions[2].upstream_model == "Qwen/Qwen2-0.5B"
    from llmserve.autoscale.providers.process import foreign_command

    assert foreign_command(spec.command, "127.0.0.1", 8123, "ext-1")[-3:] == ["127.0.0.1", "--port", "8123"]


@pytest.mark.parametrize("version, key", [
    ({"name": "x", "command": "server --port 1"}, "versions[x].command"),
    ({**FOREIGN, "engine_args": ["--max-num-seqs", "2"]}, "versions[ext].engine_args"),
    ({**FOREIGN, "ready_path": "health"}, "versions[ext].ready_path"),
    ({**FOREIGN, "load_source": "prometheus"}, "load_source"),
    ({"name": "y"}, "versions[y]: give a model"),
])
def test_command_errors_name_the_key(version, key):
    data = deployment()
    data["models"][0]["versions"].append(version)
    assert key in error_of(data)
