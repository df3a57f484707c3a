"""A LoRA adapter version in ``llmserve serve``'s file: no pool of its own; its requests are
its base pool's load (one controller, which counts both versions' traffic)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.serve.serve import build_deployment
from llmserve.serve.serve_config import ServeConfig

from .fakes import FakeProber, FakeProvider

KEY = "admin-key-for-autoscale-tests-0123"
SQL = {"name": "v2", "pool": "v1", "adapter": {"name": "sql-lora", "path": "/adapters/sql"}}


def deployment(*versions: dict) -> dict:
    return {"autoscale": {"policy": "static", "static": {"instances": 1}, "tick_s": 0.1},
            "models": [{"name": "chat", "versions": [
                {"name": "v1", "model": "/models/a", "engine_args": ["--max-loras", "4"]}, *versions],
                "canary": {"version": "v2", "stable": "v1", "start_weight": 0.05}}]}


def test_an_adapter_version_is_a_version_of_the_gateway_but_not_a_pool():
    cfg = ServeConfig.model_validate(deployment(SQL))
    (v1,) = cfg.pools()
    assert v1.key == "chat/v1" and v1.adapter_versions == ("v2",)
    m = cfg.gateway_config("x" * 16).models[0]
    assert [v.name for v in m.versions] == ["v1", "v2"]
    v2 = m.version("v2")
    assert v2.pool == "v1" and v2.adapter.name == "sql-lora" and v2.weight == 0  # the canary's: the analysis'
    assert m.pool_of("v2") == "v1"


def test_an_alias_names_the_adapter_version_through_serve():
    d = deployment(SQL)
    d["models"][0]["aliases"] = {"sql-lora": "v2"}
    m = ServeConfig.model_validate(d).gateway_config("x" * 16).models[0]
    assert m.aliases == {"sql-lora": "v2"}
    d["models"][0]["aliases"] = {"sql-lora": "v7"}
    with pytest.raises(ValidationError, match="alias 'sql-lora' names version 'v7'"):
        ServeConfig.model_validate(d).gateway_config("x" * 16)


@pytest.mark.parametrize("extra,key", [
    ({"model": "/models/b"}, "model"), ({"engine_args": ["--max-num-seqs", "4"]}, "engine_args"),
    ({"autoscale": {"bounds": {"max_instances": 2}}}, "autoscale"), ({"command": "x {port}"}, "command"),
])
def test_an_adapter_version_has_no_engine_of_its_own(extra, key):
    with pytest.raises(ValidationError, match=f"{key}: an adapter version runs on the pool of 'v1'"):
        ServeConfig.model_validate(deployment({**SQL, **extra}))


def test_an_adapter_on_a_missing_pool_is_refused():
    with pytest.raises(ValidationError, match="names pool 'v9'"):
        ServeConfig.model_validate(deployment({**SQL, "pool": "v9"}))


def test_the_base_controller_counts_the_adapter_versions_traffic():
    cfg = ServeConfig.model_validate(deployment(SQL))
    provider = FakeProvider(initial_state="ready", url_template="http://127.0.0.1:9/{id}")
    app, controllers = build_deployment(cfg, provider, KEY, prober=FakeProber(provider))
    (ctl,) = controllers
    gw = app.state.gateway
    assert ctl.pool is gw.pool("chat", "v1") and gw.models["chat"].pool_of["v2"] is ctl.pool
    assert ctl.versions == {"v1", "v2"}
    now, w = ctl.clock() + 0.5, ctl.config.signal_window_s
    for _ in range(10):
        for obs in gw.observers:  # as the gateway's recorder tells every observer
            obs.on_arrival("chat", "v2", now, 400)
            obs.on_arrival("chat", "v1", now, 400)
            obs.on_arrival("other", "v2", now, 400)
            obs.on_first_token("chat", "v2", now, 0.75)
    sig = ctl.collector.snapshot(now + w - 0.1, [], {}, {})  # a full window, the arrivals in it
    assert sig.arrival_rate == pytest.approx(20 / w)  # both versions of chat, not the other model
    assert sig.ttft_p99 == 0.75
