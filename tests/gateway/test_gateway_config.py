from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from llmserve.gateway.config import GatewayConfig, normalize_url

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "gateway.example.yaml"


def _minimal(**model_overrides) -> dict:
    model = {"name": "chat", "versions": [
        {"name": "v1", "weight": 90, "upstreams": ["http://127.0.0.1:8001/"]},
        {"name": "v2", "weight": 10, "upstreams": ["http://127.0.0.1:8002"]}]}
    model.update(model_overrides)
    return {"models": [model]}


def test_the_example_file_loads():
    cfg = GatewayConfig.load(EXAMPLE)
    m = cfg.model("smollm2")
    assert m is not None and m.canary.version == "canary" and m.canary.stable == "v1"
    assert m.version("v1").upstreams == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert cfg.auth.admin_key.get_secret_value() == "change-me-admin-key-0123"
    assert "change-me" not in repr(cfg.auth)  # secrets stay out of logs
    assert cfg.model("nope") is None
    assert m.pool_of("sql") == "v1" and m.version("sql").adapter.name == "smollm2-sql"


def test_minimal_config_gets_defaults_and_normalised_urls():
    cfg = GatewayConfig.model_validate(_minimal())
    m = cfg.models[0]
    assert m.version("v1").upstreams == ["http://127.0.0.1:8001"]
    assert m.base_weights == {"v1": 90, "v2": 10}
    assert cfg.polling.load_interval_s == 0.25 and cfg.auth.api_keys == []
    assert m.admission.batch_min_share == 0.2


@pytest.mark.parametrize("overrides,match", [
    ({"versions": [{"name": "v1", "weight": 1}, {"name": "v1", "weight": 1}]}, "unique"),
    ({"versions": [{"name": "v1", "weight": 0}]}, "sum to 0"),
    ({"versions": [{"name": "v1", "weight": -1}]}, "greater than or equal"),
    ({"versions": [{"name": "v1", "weight": 1, "upstreams": ["ftp://x"]}]}, "scheme"),
    ({"versions": [{"name": "v1", "weight": 1, "upstreams": ["http://"]}]}, "no host"),
    ({"versions": [{"name": "v1", "weight": 1, "upstreams": ["http://a:99999"]}]}, "(?i)port"),
    ({"versions": [{"name": "v1", "weight": 1, "upstreams": ["http://a", "http://a/"]}]},
     "twice"),
    ({"versions": [{"name": "a", "weight": 1, "upstreams": ["http://a"]},
                   {"name": "b", "weight": 1, "upstreams": ["http://a"]}]}, "more than one"),
    ({"versions": [{"name": "bad name", "weight": 1}]}, "version name"),
    ({"versions": []}, "at least 1"),
    ({"canary": {"version": "v2", "stable": "v1"}}, "give it weight 0"),
    ({"canary": {"version": "v3", "stable": "v1"}}, "not among"),
    ({"balancer": {"weights": {"nope": 1}}}, "unknown scorers"),
    ({"admission": {"batch_min_share": 1.5}}, "less than or equal"),
    ({"surprise": 1}, "Extra inputs"),
])
def test_invalid_configs_are_rejected_with_a_clear_message(overrides, match):
    with pytest.raises(ValidationError, match=match):
        GatewayConfig.model_validate(_minimal(**overrides))


def test_canary_with_zero_weight_is_accepted():
    data = _minimal()
    data["models"][0]["versions"][1]["weight"] = 0
    data["models"][0]["canary"] = {"version": "v2", "stable": "v1", "interval_s": 5}
    cfg = GatewayConfig.model_validate(data)
    assert cfg.models[0].canary.interval_s == 5


def test_duplicate_models_and_weak_keys_are_rejected():
    data = _minimal()
    data["models"].append(data["models"][0])
    with pytest.raises(ValidationError, match="model names and aliases must be unique"):
        GatewayConfig.model_validate(data)
    with pytest.raises(ValidationError, match="admin key"):
        GatewayConfig.model_validate({**_minimal(), "auth": {"admin_key": "short"}})
    with pytest.raises(ValidationError, match="API keys"):
        GatewayConfig.model_validate({**_minimal(), "auth": {"api_keys": ["abc"]}})


def test_load_rejects_a_non_mapping(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ValueError, match="mapping"):
        GatewayConfig.load(p)


def test_normalize_url_keeps_a_path_prefix():
    assert normalize_url("https://host:8443/prefix/") == "https://host:8443/prefix"


def _with_adapter(**v3) -> dict:
    data = _minimal()
    data["models"][0]["versions"].append({"name": "v3", "weight": 0, **v3})
    return data


def test_an_adapter_version_is_served_by_its_pool():
    data = _with_adapter(pool="v1", adapter={"name": "sql-lora", "path": "/a/sql"})
    data["models"][0]["canary"] = {"version": "v3", "stable": "v1"}
    m = GatewayConfig.model_validate(data).models[0]
    assert m.pool_of("v3") == "v1" and m.pool_of("v2") == "v2"
    assert m.version("v3").adapter.path == "/a/sql"


@pytest.mark.parametrize("v3,match", [
    ({"pool": "v1"}, "both pool and adapter"),
    ({"adapter": {"name": "x"}}, "both pool and adapter"),
    ({"pool": "v9", "adapter": {"name": "x"}}, r"names pool 'v9'.*\['v1', 'v2'\]"),
    ({"pool": "v3", "adapter": {"name": "x"}}, "names pool 'v3'"),
    ({"pool": "v1", "adapter": {"name": "x"}, "upstreams": ["http://127.0.0.1:9"]}, "has none of its own"),
    ({"pool": "v1", "adapter": {"name": "x"}, "upstream_model": "m"}, "upstream_model"),
    ({"pool": "v1", "adapter": {"name": "bad name"}}, "adapter name"),
    ({"pool": "v1", "adapter": {"name": "x", "rank": 8}}, "Extra inputs"),
])
def test_bad_adapter_versions_are_refused_by_name(v3, match):
    with pytest.raises(ValidationError, match=match):
        GatewayConfig.model_validate(_with_adapter(**v3))


def test_an_adapter_on_an_adapter_and_two_versions_on_one_adapter_are_refused():
    data = _with_adapter(pool="v1", adapter={"name": "x"})
    data["models"][0]["versions"].append({"name": "v4", "weight": 0, "pool": "v3", "adapter": {"name": "y"}})
    with pytest.raises(ValidationError, match="names pool 'v3'"):
        GatewayConfig.model_validate(data)
    data["models"][0]["versions"][-1] = {"name": "v4", "weight": 0, "pool": "v2", "adapter": {"name": "x"}}
    with pytest.raises(ValidationError, match=r"more than one version: \['x'\]"):
        GatewayConfig.model_validate(data)
