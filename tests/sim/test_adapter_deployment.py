"""A deployment whose canary is a LoRA adapter on the stable version's pool, replayed in
the simulator: one pool runs both versions' requests; the analysis judges the adapter's."""

from __future__ import annotations

import numpy as np

from llmserve.serve.serve_config import ServeConfig
from llmserve.sim.deployment import replay_deployment, simulate_deployment

from .test_canary_replay import LENIENT, PROFILE
from .test_simulator import short_trace


def adapter_deployment(**canary) -> ServeConfig:
    return ServeConfig.model_validate({
        "autoscale": {"policy": "kpa", "tick_s": 2.0, "bounds": {"min_instances": 1, "max_instances": 6}},
        "models": [{"name": "chat", "versions": [
            {"name": "v1", "model": "/m/a"},
            {"name": "v2", "pool": "v1", "adapter": {"name": "sql-lora", "path": "/a/sql"}}],
            "canary": {"version": "v2", "stable": "v1", "start_weight": 0.25, **canary}}]})


def test_the_adapter_version_runs_on_its_base_pool_and_adds_no_instances():
    trace = short_trace()
    results = simulate_deployment(adapter_deployment(), trace, PROFILE, rollout=False)
    v1, v2 = results["chat/v1"].summary, results["chat/v2"].summary
    assert (v1.policy, v2.policy) == ("chat/v1", "chat/v2")  # each row named by its version
    assert v1.requests + v2.requests == len(trace) and 0.2 < v2.requests / len(trace) < 0.3
    assert v1.completed == v1.requests and v2.completed == v2.requests
    assert v2.instance_hours == 0 and v1.instance_hours > 0  # the adapter rides the base pool


def test_a_load_delays_the_adapter_versions_first_requests_only():
    trace = short_trace()
    fast = simulate_deployment(adapter_deployment(), trace, PROFILE, rollout=False)
    slow, _ = replay_deployment(adapter_deployment(), trace, PROFILE, rollout=False, adapter_load_s=3.0)
    base_fast, base_slow = fast["chat/v1"].ttft, slow["chat/v1"].ttft
    ad_fast, ad_slow = fast["chat/v2"].ttft, slow["chat/v2"].ttft
    assert np.nanmax(ad_slow - ad_fast) > 2.5  # the request that met an instance without it
    assert np.nanmedian(ad_slow - ad_fast) < 0.1  # most found it resident
    assert np.nanmedian(np.abs(base_slow - base_fast)) < 0.1


def test_an_adapter_canary_is_promoted_like_a_full_version():
    results, rollout = replay_deployment(adapter_deployment(**LENIENT), short_trace(), PROFILE)
    actions = [e["action"] for e in rollout.events]
    assert actions[0] == "start" and actions[-1] == "promote"
    assert [w["v2"] for _, w in rollout.schedule][-1] == 1.0
    promoted_at = rollout.schedule[-1][0]
    assert not np.any(results["chat/v1"].arrival_s >= promoted_at)


def test_the_cli_replays_an_adapter_deployment_with_its_load_time(tmp_path, capsys):
    import json

    import yaml

    from llmserve.sim.cli import main

    cfg = {"autoscale": {"policy": "kpa", "bounds": {"min_instances": 1, "max_instances": 2}},
           "models": [{"name": "chat", "versions": [
               {"name": "v1", "model": "/m/a"},
               {"name": "v2", "pool": "v1", "weight": 1, "adapter": {"name": "sql-lora", "path": "/a"}}]}]}
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(cfg))
    rows = {}
    for load_s in (0.0, 5.0):
        out = tmp_path / f"out-{load_s}"
        assert main(["--deployment", str(tmp_path / "deploy.yaml"), "--trace", "bursty", "--hours", "0.25",
                     "--base-rps", "0.05", "--adapter-load-s", str(load_s), "--out", str(out)]) == 0
        rows[load_s] = {r["policy"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}
    assert set(rows[0.0]) == {"chat/v1", "chat/v2"}
    assert rows[5.0]["chat/v2"]["ttft_p99_s"] > rows[0.0]["chat/v2"]["ttft_p99_s"] + 4  # the loads' wait
    assert "chat/v2" in capsys.readouterr().out
