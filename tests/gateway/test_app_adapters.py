"""LoRA adapter versions through the live gateway (fake upstreams with vLLM's adapter API):
the base pool's instances serve them with "model" rewritten, residency first, one load
where none has it, a failed load retried on another instance."""

import asyncio
import time
from collections import Counter

import httpx

from .app_harness import instance_of, stack, wait_until
from .fake_upstream import Behaviour

SQL = {"pool": "v1", "adapter": {"name": "sql-lora", "path": "/adapters/sql"}}


def _ids(s):
    return {s.upstreams[b].url: b for b in s.fakes}


def _by_fake(s, response):
    urls = {i.instance_id: i.url for i in s.gateway.pool("chat", "v1").instances()}
    return _ids(s)[urls[instance_of(response)]]


def _forced(*fakes, v2=SQL, **kw):
    """v1 on ``fakes``, v2 an adapter on its pool at weight 0, reached by forcing it."""
    return stack({"v1": list(fakes), "v2": []}, weights={"v1": 1, "v2": 0}, version_extra={"v2": v2},
                 auth={"open_privileges": {"version_override": True}}, **kw)


def _on_v2(s, text="q"):
    return s.chat(text, headers={"x-llmserve-version": "v2"})


def _reported(s):
    pool = s.gateway.pool("chat", "v1")
    wait_until(lambda: all(i.report is not None for i in pool.instances()), what="reports")


def test_an_adapter_version_runs_on_the_base_pool_where_the_adapter_is_resident():
    has = Behaviour("has", base_model="chat", adapters={"sql-lora"}, report_running=3)
    lacks = Behaviour("lacks", base_model="chat")
    with stack({"v1": [has, lacks], "v2": []}, weights={"v1": 1, "v2": 1},
               version_extra={"v2": SQL}) as s:
        assert set(s.gateway.models["chat"].pools) == {"v1"}  # no pool of its own
        _reported(s)
        picks = Counter()
        for i in range(12):
            r = s.chat(f"q{i}", user=f"u{i}")
            assert r.status_code == 200, r.text
            picks[(r.headers["x-llmserve-version"], _by_fake(s, r))] += 1
        adapter_on = {f for (v, f) in picks if v == "v2"}
        assert adapter_on == {"has"}, picks  # resident: preferred over the idler instance
        assert ("v1", "lacks") in picks  # base traffic by load: the idle one
        sent = [b["model"] for b in has.bodies]
        assert "sql-lora" in sent and all(b["model"] == "chat" for b in lacks.bodies)
        assert not has.adapter_loads and not lacks.adapter_loads
        desc = s.admin("GET", "/models").json()
        v2 = next(v for m in desc["models"] if m["name"] == "chat" for v in m["versions"] if v["name"] == "v2")
        assert v2["pool"] == "v1" and v2["adapter"] == "sql-lora" and v2["instances"] == 2
        r = s.admin("POST", "/models/chat/versions/v2/instances", json={"url": "http://127.0.0.1:9"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "adapter_version", r.text
        metrics = s.client.get("/metrics").text
        assert 'version_weight{model="chat",version="v2"}' in metrics
        on = [line for line in metrics.splitlines() if line.startswith("llmserve:gateway_instance_adapter{")]
        assert len(on) == 1 and 'adapter="sql-lora"' in on[0] and 'state="resident"' in on[0] and 'version="v1"' in on[0]


async def test_nowhere_resident_one_load_on_the_least_loaded_serves_every_request():
    busy = Behaviour("busy", base_model="chat", report_running=4, tokens=1)
    idle = Behaviour("idle", base_model="chat", load_delay_s=0.3, tokens=1)
    with _forced(busy, idle) as s:
        _reported(s)
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            async def one(i):
                return await c.post("/v1/chat/completions", headers={"x-llmserve-version": "v2"}, json={
                    "model": "chat", "messages": [{"role": "user", "content": f"q{i}"}]})
            rs = await asyncio.gather(*(one(i) for i in range(6)))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
        assert len(idle.adapter_loads) == 1 and not busy.adapter_loads
        assert idle.adapter_loads[0] == {"lora_name": "sql-lora", "lora_path": "/adapters/sql"}
        assert {_by_fake(s, r) for r in rs} == {"idle"}
        assert [b["model"] for b in idle.bodies] == ["sql-lora"] * 6


def test_a_failed_load_is_retried_on_another_instance():
    broken = Behaviour("broken", base_model="chat", load_status=500)  # least loaded: tried first
    fine = Behaviour("fine", base_model="chat", report_running=2)
    with _forced(broken, fine) as s:
        _reported(s)
        r = _on_v2(s, "q")
        assert r.status_code == 200, r.text
        assert _by_fake(s, r) == "fine"
        assert len(broken.adapter_loads) == 1 and len(fine.adapter_loads) == 1
        # resident on "fine" now (our load, then its report): no second load anywhere
        for i in range(4):
            assert _by_fake(s, _on_v2(s, f"again {i}")) == "fine"
        assert len(broken.adapter_loads) == 1 and len(fine.adapter_loads) == 1


def test_a_load_failing_everywhere_is_a_502_and_base_traffic_is_untouched():
    fakes = [Behaviour(n, base_model="chat", load_status=400) for n in "ab"]
    with _forced(*fakes) as s:
        _reported(s)
        r = _on_v2(s, "q")
        assert r.status_code == 502 and r.json()["error"]["code"] == "adapter_load_failed", r.text
        assert "injected load failure" in r.json()["error"]["message"]
        # each instance tried; the retries stop at retry.max_attempts (3)
        assert all(f.adapter_loads for f in fakes) and sum(len(f.adapter_loads) for f in fakes) == 3
        assert all(s.chat(f"base {i}").status_code == 200 for i in range(4))
        # a 4xx load says nothing of the instance's health: no breaker opened
        assert all(st.value == "closed" for st in s.gateway.pool("chat", "v1").breaker_states().values())


def test_an_adapter_without_a_path_goes_only_where_the_engines_preloaded_it():
    preloaded = {"pool": "v1", "adapter": {"name": "sql-lora"}}
    with _forced(Behaviour("a", base_model="chat"), v2=preloaded) as s:
        _reported(s)
        r = _on_v2(s, "q")
        assert r.status_code == 502 and r.json()["error"]["code"] == "adapter_not_resident", r.text
        s.fakes["a"].adapters.add("sql-lora")  # e.g. started with --lora-modules
        pool = s.gateway.pool("chat", "v1")
        wait_until(lambda: "sql-lora" in pool.instances()[0].report.lora_adapters, what="report")
        assert _on_v2(s, "q").status_code == 200


# The canary analysis at test_app_canary.py's settings, the canary an adapter on v1's pool.
ADAPTER_CANARY = {"version": "v2", "stable": "v1", "start_weight": 0.3, "step_weight": 0.2, "max_weight": 0.5,
                  "interval_s": 0.5, "failure_threshold": 2, "min_requests": 3, "latency_slack_s": 0.05,
                  "max_error_rate_delta": 0.05, "max_refusal_rate_delta": 0.05}


def _roll_out(s, until, limit_s=60.0):
    deadline, i, base_failed = time.monotonic() + limit_s, 0, 0
    while not until():
        assert time.monotonic() < deadline, "the rollout did not settle"
        r = s.chat(f"q{i}", user=f"user-{i}")
        base_failed += r.headers["x-llmserve-version"] == "v1" and r.status_code != 200
        i += 1
    return base_failed


def test_a_healthy_adapter_canary_is_promoted_on_the_base_pool():
    fakes = [Behaviour(n, base_model="chat", tokens=1) for n in "ab"]
    with stack({"v1": fakes, "v2": []}, weights={"v1": 1, "v2": 0}, version_extra={"v2": SQL},
               model={"canary": ADAPTER_CANARY}) as s:
        rt = s.gateway.models["chat"]
        assert _roll_out(s, lambda: rt.canary.state.value == "promoted") == 0
        assert all(s.chat(f"after {i}", user=f"after-{i}").headers["x-llmserve-version"] == "v2" for i in range(8))
        assert sum(len(f.adapter_loads) for f in fakes) <= 2  # loaded once per instance at most
        assert sum(b["model"] == "sql-lora" for f in fakes for b in f.bodies) > 0


def test_an_adapter_canary_whose_load_fails_is_rolled_back_and_base_traffic_never_fails():
    fakes = [Behaviour(n, base_model="chat", tokens=1, load_status=400) for n in "ab"]  # e.g. rank too large
    with stack({"v1": fakes, "v2": []}, weights={"v1": 1, "v2": 0}, version_extra={"v2": SQL},
               model={"canary": ADAPTER_CANARY}) as s:
        rt = s.gateway.models["chat"]
        assert _roll_out(s, lambda: rt.canary.state.value == "rolled_back") == 0
        events = s.admin("GET", "/models/chat/canary/history").json()["events"]
        assert events[-1]["action"] == "rollback" and "error rate canary" in events[-1]["reason"]
        assert "adapter_load_failed" in events[-1]["reason"]
        assert all(s.chat(f"after {i}", user=f"after-{i}").status_code == 200 for i in range(8))


def test_a_broken_adapter_stream_resumes_on_another_instance_which_loads_the_adapter_first():
    has = Behaviour("has", base_model="chat", adapters={"sql-lora"}, tokens=8, break_after_tokens=3)
    other = Behaviour("other", base_model="chat", tokens=8)
    with _forced(has, other) as s:
        _reported(s)
        body = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with s.client.stream("POST", "/v1/chat/completions", json=body, headers={"x-llmserve-version": "v2"}) as r:
            assert r.status_code == 200
            text = r.read().decode()
        assert text.rstrip().endswith("data: [DONE]") and "t7 " in text, text
        assert not has.adapter_loads and len(other.adapter_loads) == 1  # loaded where the stream went on
        assert other.bodies[0]["model"] == "sql-lora" and other.bodies[0]["resume_token_ids"] == [0, 1, 2]


def test_an_instance_that_evicted_the_adapter_since_its_report_gets_the_request_retried_and_loaded_elsewhere():
    stale = Behaviour("stale", base_model="chat", report_adapters={"sql-lora"})  # says resident; is not
    other = Behaviour("other", base_model="chat", report_running=1)
    with _forced(stale, other) as s:
        _reported(s)
        r = _on_v2(s, "q")
        assert r.status_code == 200, r.text
        assert _by_fake(s, r) == "other" and len(other.adapter_loads) == 1
        assert [b["model"] for b in stale.bodies] == ["sql-lora"]  # its 404 was not the client's answer
        assert all(st.value == "closed" for st in s.gateway.pool("chat", "v1").breaker_states().values())


def test_an_alias_names_an_adapter_version_as_vllm_serves_adapters_by_name():
    """``aliases`` (configured, not claimed): ``model: "sql-lora"`` reaches the adapter version
    outside the weights, the answer is named as asked, and /v1/models lists it with its parent."""
    has = Behaviour("has", base_model="chat", adapters={"sql-lora"}, tokens=1)
    with stack({"v1": [has], "v2": []}, weights={"v1": 1, "v2": 0}, version_extra={"v2": SQL},
               model={"aliases": {"sql-lora": "v2", "chat-base": "v1"}}) as s:
        for model, version, sent in (("sql-lora", "v2", "sql-lora"), ("chat", "v1", "chat"),
                                     ("chat-base", "v1", "chat")):
            r = s.chat("q", model=model)
            assert r.status_code == 200, r.text
            assert r.headers["x-llmserve-version"] == version and r.json()["model"] == model
            assert has.bodies[-1]["model"] == sent  # the engine's own names: the adapter's, the base's
        streamed = s.chat("q", model="sql-lora", stream=True)
        assert streamed.status_code == 200 and '"model": "sql-lora"' in streamed.text.replace('":"', '": "')
        cards = {m["id"]: m for m in s.client.get("/v1/models").json()["data"]}
        assert cards["sql-lora"]["parent"] == "chat" and cards["sql-lora"]["root"] == "sql-lora"
        assert cards["chat-base"]["parent"] == "chat" and cards["chat"]["parent"] is None
        assert s.client.get("/v1/models/sql-lora").json()["id"] == "sql-lora"
        assert s.chat("q", model="nope").status_code == 404


def test_aliases_are_checked_at_load():
    import pytest

    from llmserve.gateway.config import GatewayConfig

    base = {"name": "chat", "versions": [{"name": "v1", "weight": 1, "upstreams": ["http://127.0.0.1:9"]}]}
    with pytest.raises(ValueError, match="alias 'x' names version 'v9'"):
        GatewayConfig.model_validate({"models": [{**base, "aliases": {"x": "v9"}}]})
    with pytest.raises(ValueError, match="must be unique"):
        GatewayConfig.model_validate({"models": [{**base, "aliases": {"chat": "v1"}}]})
    other = {"name": "other", "versions": [{"name": "v1", "weight": 1, "upstreams": ["http://127.0.0.1:8"]}],
             "aliases": {"x": "v1"}}
    with pytest.raises(ValueError, match="must be unique"):
        GatewayConfig.model_validate({"models": [{**base, "aliases": {"x": "v1"}}, other]})
    with pytest.raises(ValueError, match="model name"):
        GatewayConfig.model_validate({"models": [{**base, "aliases": {"bad name": "v1"}}]})
