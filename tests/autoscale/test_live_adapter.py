"""Live, issue 31: ``llmserve serve`` with v1 = the base model and v2 = a LoRA adapter
canary on v1's pool, from 5 %.

Both runs use one real engine pool (two instances of a tiny random Llama with LoRA
enabled) and closed-loop clients. A healthy adapter (a random PEFT rank-8 adapter)
is promoted; an adapter the engines refuse (rank 32 over ``--max-lora-rank 16``:
every load answers 400, so every v2 request fails) is rolled back. In both, the
base pool is never restarted (the same instances, started once, serve to the end)
and no request routed to v1 fails.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.helpers import make_tiny_llama

from .serve_harness import Load, ServeProcess, serve_config

pytestmark = pytest.mark.slow

CLIENTS = 4


def _engine_has_lora() -> bool:
    out = subprocess.run([sys.executable, "-m", "llmserve.cli", "engine", "--help"], capture_output=True, text=True)
    return "--max-lora-rank" in out.stdout


def write_adapter(model_dir, out_dir, rank: int, seed: int = 0):
    """A random PEFT LoRA adapter on q and v for the tiny model (tests/lora_adapters.py)."""
    from transformers import AutoModelForCausalLM

    from tests.lora_adapters import make_adapter

    make_adapter(AutoModelForCausalLM.from_pretrained(model_dir), out_dir, rank, ["q_proj", "v_proj"], seed)
    return out_dir


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    if not _engine_has_lora():
        pytest.skip("the engine has no LoRA flags (issue 31's engine part is not merged here)")
    d = tmp_path_factory.mktemp("lora")
    model = make_tiny_llama(d, max_position_embeddings=1024)
    return model, write_adapter(model, d / "good", rank=8), write_adapter(model, d / "too-big", rank=32, seed=1)


def adapter_config(model, adapter_path) -> dict:
    cfg = serve_config(model, engine_args=["--max-num-seqs", "8", "--enable-lora", "--max-loras", "2",
                                                "--max-lora-rank", "16"],
                       autoscale={"policy": "static", "static": {"instances": 2},
                                  "bounds": {"min_instances": 2, "max_instances": 2}})
    del cfg["model"], cfg["served_model_name"]
    cfg["models"] = [{
        "name": "chat",
        "versions": [{"name": "v1", "model": str(model)},
                     {"name": "v2", "pool": "v1", "adapter": {"name": "tiny-sql", "path": str(adapter_path)}}],
        "canary": {"version": "v2", "stable": "v1", "start_weight": 0.05, "step_weight": 0.3, "max_weight": 0.65,
                   "interval_s": 3.0, "min_requests": 2, "failure_threshold": 2,
                   # Verdicts on a few dozen requests: loose error margins, no latency or length tests
                   # (a random adapter changes what the tiny model writes, and so its lengths).
                   "max_error_rate_delta": 0.3, "max_refusal_rate_delta": 0.3, "max_ttft_ratio": None,
                   "max_tpot_ratio": None, "max_e2e_ratio": None, "min_output_ratio": None},
    }]
    return cfg


def roll_out(tmp_path, config: dict, final: str) -> tuple[ServeProcess, Load, list[dict], list[dict]]:
    serve = ServeProcess(config, tmp_path)
    try:
        serve.wait_ready(2, timeout=180, pool="chat/v1")
        before = serve.instances(finished=True)
        with Load(serve.url, {"model": "chat", "prompt": "select the rows", "max_tokens": 4}, CLIENTS) as load:
            deadline = time.monotonic() + 240
            while serve.canary("chat")["state"] == "progressing":
                assert time.monotonic() < deadline, f"the rollout did not settle\n{serve.log()[-5000:]}"
                assert serve.proc.poll() is None, serve.log()[-5000:]
                time.sleep(0.3)
            time.sleep(2.0)  # traffic after the verdict, at its final weights
        assert serve.canary("chat")["state"] == final, serve.admin("GET", "/models/chat/canary/history").json()
        return serve, load, before, serve.instances(finished=True)
    except BaseException:
        serve.stop()
        raise


def assert_base_pool_untouched(before: list[dict], after: list[dict]) -> None:
    ids = lambda rows: sorted(i["instance_id"] for i in rows)  # noqa: E731
    assert ids(before) == ids(after) == ["v1-1", "v1-2"]  # nobody started, stopped or replaced
    assert all(i["state"] == "ready" for i in after)


def test_a_healthy_adapter_canary_is_promoted_without_restarting_the_base_pool(tmp_path, adapters):
    model, good, _ = adapters
    serve, load, before, after = roll_out(tmp_path, adapter_config(model, good), "promoted")
    try:
        hist = serve.admin("GET", "/models/chat/canary/history").json()["events"]
        actions = [e["action"] for e in hist]
        assert actions[0] == "start" and hist[0]["weight"] == 0.05
        assert actions[-1] == "promote" and "advance" in actions
        assert sum(r[1] == "v2" and r[2] == 200 for r in load.results) > 10  # served on the adapter
        assert load.failed("v1") == [], load.failed("v1")[:5]
        assert load.failed("v2") == [], load.failed("v2")[:5]
        assert_base_pool_untouched(before, after)
        # The adapter is resident where it served (the instances' own /load, through the gateway's view).
        pools = serve.admin("GET", "/pools").json()["pools"]
        assert any("tiny-sql" in i["adapters"] for p in pools for i in p["instances"])
        assert 'version_weight{model="chat",version="v2"} 1.0' in serve.metrics()
    finally:
        serve.stop()


def test_an_adapter_canary_that_misbehaves_is_rolled_back_and_base_traffic_never_fails(tmp_path, adapters):
    model, _, too_big = adapters
    serve, load, before, after = roll_out(tmp_path, adapter_config(model, too_big), "rolled_back")
    try:
        hist = serve.admin("GET", "/models/chat/canary/history").json()["events"]
        assert hist[-1]["action"] == "rollback" and "adapter_load_failed" in hist[-1]["reason"], hist[-1]
        assert "promote" not in [e["action"] for e in hist]
        assert load.failed("v1") == [], load.failed("v1")[:5]
        assert len(load.failed("v2")) > 0  # it did misbehave, and was seen to
        assert_base_pool_untouched(before, after)
        last = hist[-1]["timestamp"]
        assert [r for r in load.results if r[0] > last + 0.5 and r[1] == "v2"] == []  # nobody sent to it since
    finally:
        serve.stop()
