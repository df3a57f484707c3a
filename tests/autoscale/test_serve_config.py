"""``llmserve serve``'s file is validated when it is loaded: a misspelt key in any
section is an error that names the key by its path."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from llmserve.serve.serve_config import ServeConfig


def load(tmp_path, data: dict, overrides: dict | None = None) -> ServeConfig:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(data))
    return ServeConfig.load(path, overrides)


@pytest.mark.parametrize("data, key", [
    ({"autoscale": {"bounds": {"max_instanses": 3}}}, "autoscale.bounds.max_instanses"),
    ({"autoscale": {"predictive": {"lead_time": 30}}}, "autoscale.predictive.lead_time"),
    ({"autoscale": {"polcy": "kpa"}}, "autoscale.polcy"),
    ({"lifecycle": {"drain_timeout": 3}}, "lifecycle.drain_timeout"),
    ({"gateway": {"retry": {"max_attempt": 2}}}, "gateway.retry.max_attempt"),
    ({"pool": {"balancer": {"bogus": 1}}}, "pool.balancer.bogus"),
])
def test_a_misspelt_key_fails_at_load_naming_it(tmp_path, data, key):
    with pytest.raises(ValidationError) as e:
        load(tmp_path, data)
    assert f"{key}\n" in str(e.value) and "Extra inputs are not permitted" in str(e.value)


def test_a_misspelt_key_in_a_version_names_the_version(tmp_path):
    data = {"models": [{"name": "chat", "versions": [
        {"name": "v1", "model": "/m/a", "autoscale": {"kpa": {"panic_windw_s": 3}}}]}]}
    with pytest.raises(ValidationError) as e:
        load(tmp_path, data)
    assert "models[chat].versions[v1].autoscale" in str(e.value) and "kpa.panic_windw_s" in str(e.value)


def test_a_bad_value_in_a_versions_autoscale_is_one_line(tmp_path):
    """Pydantic's own text of the version's error is several lines; the CLI prints one."""
    from llmserve.flags import flag_error

    data = {"models": [{"name": "chat", "versions": [
        {"name": "v1", "model": "/m/a", "autoscale": {"bounds": {"min_instances": -1}}}]}]}
    with pytest.raises(ValidationError) as e:
        load(tmp_path, data)
    line = flag_error(e.value)
    assert "\n" not in line and "models[chat].versions[v1].autoscale: bounds: " in line
    assert "bounds.min_instances must be >= 0, got -1" in line and "pydantic.dev" not in line


@pytest.mark.parametrize("pool, key", [
    ({"admision": {"realtime": {"deadline_s": 60}}}, "models.0.pool.admision"),
    ({"admission": {"realtime": {"deadline_sx": 60}}}, "models.0.pool.admission.realtime.deadline_sx"),
    ({"balancer": {"tie_margn": 0.1}}, "models.0.pool.balancer.tie_margn"),
])
def test_a_misspelt_key_in_a_models_pool_fails_at_load_naming_it(tmp_path, pool, key):
    data = {"models": [{"name": "chat", "versions": [{"name": "v1", "model": "/m/a"}], "pool": pool}]}
    with pytest.raises(ValidationError) as e:
        load(tmp_path, data)
    assert f"{key}\n" in str(e.value) and "Extra inputs are not permitted" in str(e.value)


def test_a_models_pool_and_canary_are_typed_over_the_top_level_pool(tmp_path):
    data = {"pool": {"admission": {"realtime": {"max_queue": 100, "deadline_s": 10}},
                     "balancer": {"weights": {"queue": 1.0}}},
            "models": [{"name": "chat", "versions": [{"name": "v1", "model": "/m/a"},
                                                     {"name": "v2", "model": "/m/b"}],
                        "canary": {"version": "v2", "stable": "v1", "step_weight": 0.1},
                        "pool": {"admission": {"realtime": {"deadline_s": 60}}, "concurrency": {"fixed": 4}}},
                       {"name": "code", "versions": [{"name": "v1", "model": "/m/c"}]}]}
    cfg = load(tmp_path, data)
    chat, code = cfg.models
    assert (chat.pool.admission.realtime.max_queue, chat.pool.admission.realtime.deadline_s) == (100, 60.0)
    assert chat.pool.concurrency.fixed == 4 and chat.pool.balancer.weights == {"queue": 1.0}
    assert code.pool == cfg.pool  # no pool of its own: the top level's
    assert (chat.canary.version, chat.canary.step_weight, chat.canary.start_weight) == ("v2", 0.1, 0.05)
    assert [p.weight for p in cfg.pools()] == [1.0, 0.0, 1.0]  # the canary version starts at 0
    gw = {m.name: m for m in cfg.gateway_config("x" * 16).models}
    assert gw["chat"].admission == chat.pool.admission and gw["chat"].concurrency.fixed == 4
    assert gw["code"].admission.realtime.deadline_s == 10.0 and gw["chat"].canary == chat.canary
    with pytest.raises(ValidationError, match="models.0.canary.step_weigt"):
        load(tmp_path, {**data, "models": [{**data["models"][0], "canary": {"version": "v2", "stable": "v1",
                                                                            "step_weigt": 0.1}}]})


def test_a_bad_value_is_refused_at_load_with_its_check(tmp_path):
    with pytest.raises(ValidationError, match="autoscale config: bounds.max_instances must be >= max"):
        load(tmp_path, {"autoscale": {"bounds": {"min_instances": 5, "max_instances": 2}}})


def test_sections_are_typed_with_serve_defaults_under_the_file(tmp_path):
    cfg = load(tmp_path, {"autoscale": {"bounds": {"max_instances": 6}}, "lifecycle": {"drain_timeout_s": 3}},
               {"autoscale": {"tick_s": 0.5}})
    auto = cfg.autoscale_config()
    assert auto.bounds.max_instances == 6 and auto.tick_s == 0.5
    assert auto.bounds.scale_down_window_s == 120.0  # serve's default, not the library's 300
    assert auto.predictive.lead_time_s == 30.0 and auto.predictive.level_tau_s == 120.0
    assert cfg.controller_config().drain_timeout_s == 3
    with pytest.raises(ValidationError):  # frozen: validated once, never changed after
        auto.tick_s = 1.0


def test_a_version_overrides_merge_over_the_top_level(tmp_path):
    data = {"autoscale": {"policy": "kpa", "bounds": {"max_instances": 6}, "kpa": {"stable_window_s": 30}},
            "models": [{"name": "chat", "versions": [
                {"name": "v1", "model": "/m/a"},
                {"name": "v2", "model": "/m/b", "autoscale": {"bounds": {"min_instances": 0},
                                                              "kpa": {"panic_window_s": 3}}}]}]}
    v1, v2 = (p.autoscale for p in load(tmp_path, data).pools())
    assert (v1.bounds.min_instances, v1.bounds.max_instances, v1.kpa.panic_window_s) == (1, 6, 6.0)
    assert (v2.bounds.min_instances, v2.bounds.max_instances, v2.policy) == (0, 6, "kpa")
    assert (v2.kpa.stable_window_s, v2.kpa.panic_window_s) == (30.0, 3.0)


def test_flags_override_the_file_and_leave_the_rest(tmp_path):
    import argparse

    from llmserve.serve.serve import add_serve_args, overrides_from_args

    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args(["--max-instances", "6", "--policy", "kpa", "--engine-args", "--max-num-seqs 8",
                         "--provider", "ray", "--scale-down-window", "30"])
    cfg = load(tmp_path, {"port": 9000, "autoscale": {"bounds": {"min_instances": 2, "max_instances": 3}}},
               overrides_from_args(args))
    b = cfg.autoscale.bounds
    assert (b.min_instances, b.max_instances, b.scale_down_window_s, cfg.autoscale.policy) == (2, 6, 30.0, "kpa")
    assert cfg.engine_args == ["--max-num-seqs", "8"] and cfg.provider.kind == "ray" and cfg.port == 9000
    with pytest.raises(SystemExit):
        p.parse_args(["--log-level", "loud"])


@pytest.mark.parametrize("args, says", [
    (["--max-num-seqz", "4"], "llmserve engine does not take --max-num-seqz 4"),
    (["--max-num-seqs", "four"], "invalid int value: 'four'"),
    (["--port", "9"], "set --port through serve's own settings"),
    (["--max-num-seqs", "-3"], "--max-num-seqs: Input should be greater than or equal to 1, got -3"),
    (["--max-model-len", "0"], "--max-model-len: Input should be greater than or equal to 1, got 0"),
    (["--priority-range", "5", "1"], "--priority-range: priority range \\[5, 1\\] is empty"),
])
def test_engine_args_the_engine_would_refuse_fail_at_load(tmp_path, args, says):
    """Not as an instance that exits at every start while serve restarts it."""
    with pytest.raises(ValidationError, match=says):
        load(tmp_path, {"engine_args": args})
    with pytest.raises(ValidationError, match=says):
        load(tmp_path, {"models": [{"name": "chat", "versions": [{"name": "v1", "model": "/m/a",
                                                                   "engine_args": args}]}]})
    assert load(tmp_path, {"engine_args": ["--max-num-seqs", "4", "--no-enable-prefix-caching"]}).engine_args


def test_the_gateway_sections_admin_key_is_serves_admin_key(tmp_path):
    key = "admin-key-0123456789abcdef"
    cfg = load(tmp_path, {"gateway": {"auth": {"admin_key": key}}})
    assert cfg.admin_key == key and cfg.gateway_config(cfg.admin_key).auth.admin_key.get_secret_value() == key
    with pytest.raises(ValidationError, match="differ"):
        load(tmp_path, {"admin_key": "another-key-0123456789", "gateway": {"auth": {"admin_key": key}}})


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_yaml_syntax_error_is_one_line(tmp_path, command):
    import subprocess
    import sys

    path = tmp_path / "bad.yaml"
    path.write_text("port: 18201\nmodel: [unclosed\n")
    r = subprocess.run([sys.executable, "-m", "llmserve.cli", command, "--config", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"llmserve: error: {path}: not valid YAML: expected ',' or ']', but got '<stream end>' at line 3, column 1"]


def test_instances_accept_every_integer_priority_a_key_is_granted(tmp_path):
    """A key's priority_range reaches the instances' --priority-range (else each of its
    requests is refused there); a range set in engine_args is left as given."""
    keys = [{"key": "ops-key-aaaa-99999", "name": "ops", "priority_range": [-10, 5]},
            {"key": "bulk-key-aaaa-9999", "name": "bulk", "priority_range": [1, 20]}]
    cfg = load(tmp_path, {"gateway": {"auth": {"keys": keys}}})
    args = list(cfg.instance_spec("v1-1").engine_args)
    assert args[args.index("--priority-range") + 1:][:2] == ["-10", "20"]
    assert "--priority-range" not in load(tmp_path, {}).instance_spec("v1-1").engine_args
    cfg = load(tmp_path, {"gateway": {"auth": {"keys": keys}}, "engine_args": ["--priority-range", "-3", "30"]})
    assert list(cfg.instance_spec("v1-1").engine_args).count("--priority-range") == 1


def test_prices_reach_the_gateway_and_an_unpriced_money_budget_is_refused(tmp_path):
    keys = [{"key": "money-key-aaaa-1", "name": "money", "limits": {"budget": {"amount": 0.01, "period": "day"}}}]
    with pytest.raises(ValidationError, match="an amount budget needs a model's price_per_1k"):
        load(tmp_path, {"gateway": {"auth": {"keys": keys}}})
    cfg = load(tmp_path, {"gateway": {"auth": {"keys": keys}}, "price_per_1k_prompt_tokens": 0.1,
                          "price_per_1k_completion_tokens": 0.3})
    m = cfg.gateway_config("x" * 16).models[0]
    assert (m.price_per_1k_prompt_tokens, m.price_per_1k_completion_tokens) == (0.1, 0.3)
    cfg = load(tmp_path, {"gateway": {"auth": {"keys": keys}}, "models": [
        {"name": "chat", "price_per_1k_completion_tokens": 2.0, "versions": [{"name": "v1", "model": "/m/a"}]}]})
    assert cfg.gateway_config("x" * 16).models[0].price_per_1k_completion_tokens == 2.0


def test_each_deployment_has_its_own_state_folder_unless_one_is_named(tmp_path):
    """Two serves (or gateways) on one machine must not share batches, stored responses
    or instance registries: the default folder is per port; a named one is kept."""
    from llmserve.gateway.batches.config import DEFAULT_STATE_DIR, StateConfig

    a, b = (ServeConfig.load(None, {"port": p}) for p in (8123, 8124))
    assert a.gateway.state.dir == DEFAULT_STATE_DIR / "port-8123" != b.gateway.state.dir
    named = ServeConfig.load(None, {"port": 8123, "gateway": {"state": {"dir": str(tmp_path)}}})
    assert named.gateway.state.dir == tmp_path
    assert StateConfig().for_port(8080).dir == DEFAULT_STATE_DIR / "port-8080"
    assert StateConfig(dir=tmp_path).for_port(8080).dir == tmp_path
