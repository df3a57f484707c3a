"""A real instance (tiny model, in-process, over loopback HTTP): a poisoned request
fails alone and the server stays ready; a dead engine says so on ``/ready``,
``/health`` and ``/load``, and the gateway's monitor and the controller's probe see it.

In-process so the faults can be injected into the engine's runner; everything from
the HTTP edge down is the production code.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from llmserve.autoscale.probe import judge, probe_ready
from llmserve.autoscale.providers.base import RunState, RunStatus
from llmserve.engine.config import EngineConfig
from llmserve.engine.in_thread import InThreadEngine
from llmserve.engine.llm import build_engine
from llmserve.gateway.config import PollingConfig
from llmserve.gateway.monitor import Monitor
from llmserve.gateway.pool import Pool
from llmserve.gateway.upstream import UpstreamClient
from llmserve.lifecycle import InstanceState
from llmserve.server.app import Instance, create_app
from llmserve.server.config import ServerConfig
from tests.engine.faults import break_forward, hold_until_queued, poison_logits
from tests.gateway.fake_upstream import ServerThread
from tests.helpers import make_tiny_llama

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
POISON, POISON_TOO = [40, 41, 42, 43, 44], [50, 51, 52]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=256)


@pytest.fixture()
def served(tiny_path):
    core = build_engine(EngineConfig(model=str(tiny_path), num_kv_blocks=128, block_size=4))
    inst = Instance(ServerConfig(served_model_name=["tiny"]), lambda: InThreadEngine.start(lambda: core))
    asyncio.run(inst.start())  # load and warm up, as the server does before /ready turns 200
    assert inst.state.value == "ready"
    srv = ServerThread(create_app(inst)).start()
    yield inst, srv.url
    srv.stop(force=True)
    inst.engine.shutdown()


def _body(ids, stream: bool, **kw) -> dict:
    return {"model": "tiny", "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "logprobs": 0, "stream": stream, **kw}


async def _stream(c: httpx.AsyncClient, ids, **kw) -> dict:
    """The tokens (as text pieces) a stream produced, and any error events it carried."""
    tokens, errors, done = [], [], False
    async with c.stream("POST", "/v1/completions", json=_body(ids, True, **kw)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                errors.append(event["error"])
            elif event["choices"] and event["choices"][0]["logprobs"]:
                tokens += event["choices"][0]["logprobs"]["tokens"]
    return {"tokens": tokens, "errors": errors, "done": done}


async def test_a_poisoned_request_fails_alone_and_the_server_stays_ready(served, monkeypatch):
    inst, url = served
    core = inst.engine.core
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        baseline = await asyncio.gather(*(_stream(c, ids, cache_salt="baseline") for ids in PROMPTS))
        assert all(len(b["tokens"]) == 16 and not b["errors"] for b in baseline)
        shared = poison_logits(core, monkeypatch, lambda r: r.prompt_token_ids in (POISON, POISON_TOO),
                               after_tokens=3)
        hold = hold_until_queued(inst.engine, len(PROMPTS) + 2)  # all five start in one step
        *clean, bad_stream, bad_json = await asyncio.gather(
            *(_stream(c, ids) for ids in PROMPTS), _stream(c, POISON),
            c.post("/v1/completions", json=_body(POISON_TOO, False)))
        await hold
        assert [x["tokens"] for x in clean] == [b["tokens"] for b in baseline]
        assert all(not x["errors"] and x["done"] for x in clean)
        assert shared and all(len(batch) > 1 for batch in shared)  # the poison shared steps
        # the stream: its first tokens, then one error event for it, then the end of the stream
        assert len(bad_stream["tokens"]) == 3 and bad_stream["done"]
        assert [e["code"] for e in bad_stream["errors"]] == ["request_failed"]
        assert "not finite" in bad_stream["errors"][0]["message"]
        assert bad_json.status_code == 500
        err = bad_json.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "request_failed"
        assert (await c.get("/ready")).status_code == 200
        assert (await c.get("/health")).json()["status"] == "ok"
        load = (await c.get("/load")).json()
        assert load["ready"] and load["num_running"] == 0 and load["num_waiting"] == 0
        assert core.kv.usage == 0.0
        again = await _stream(c, PROMPTS[0], cache_salt="again")
        assert again["tokens"] == baseline[0]["tokens"]


async def test_a_dead_engine_answers_503_and_is_ejected(served, monkeypatch):
    inst, url = served
    pool = Pool("tiny/v1")
    seen = pool.add_instance(url, "i-1", ready=True)
    upstream = UpstreamClient(connect_timeout=2.0, read_timeout=5.0)
    monitor = Monitor(lambda: [pool], upstream, PollingConfig())
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            await monitor.check_ready(pool, seen)
            await monitor.poll_load(pool, seen)
            assert seen.ready and seen.report.ready
            body = _body(PROMPTS[0], True, max_tokens=200)
            async with c.stream("POST", "/v1/completions", json=body) as r:
                lines = r.aiter_lines()
                async for line in lines:
                    if line.startswith("data: {"):
                        break  # a first token: the stream is in flight
                break_forward(inst.engine.core, monkeypatch)
                rest = [json.loads(x[6:]) for x in [y async for y in lines] if x.startswith("data: {")]
            assert rest[-1]["error"]["code"] == "engine_dead"

            ready = await c.get("/ready")
            assert ready.status_code == 503 and ready.json()["state"] == "failed"
            assert "injected forward failure" in ready.json()["error"]
            health = await c.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "dead"
            assert (await c.get("/load")).json()["ready"] is False
            refused = await c.post("/v1/completions", json=_body(PROMPTS[1], False))
            assert refused.status_code == 503

            await monitor.check_ready(pool, seen)
            await monitor.poll_load(pool, seen)
            assert not seen.ready and not seen.report.ready  # the gateway routes nothing more to it

            probe = await probe_ready(c, url, RunStatus(RunState.RUNNING), 5.0)
            state, reason = judge(InstanceState.READY, probe, 100.0, 600.0)
            assert state is InstanceState.FAILED and "injected forward failure" in reason
    finally:
        await upstream.aclose()


@pytest.mark.parametrize("extra,status,param", [
    ({"repetition_penalty": 1e-300}, 400, "repetition_penalty"),  # issue 17: 0 in fp32, inf logits
    ({"temperature": 1e300}, 400, "temperature"),
    ({"seed": 2**64}, 400, "seed"),
    ({"seed": 2**64 - 1, "n": 2, "temperature": 1.0}, 200, None),  # the second child's seed wraps
])
async def test_degenerate_parameters_are_refused_before_the_engine(served, extra, status, param):
    _, url = served
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        r = await c.post("/v1/completions", json={**_body(PROMPTS[0], False), **extra})
        assert r.status_code == status, r.text
        if param is not None:
            assert r.json()["error"]["param"] == param
        assert (await c.get("/ready")).status_code == 200


async def test_a_lone_surrogate_salt_never_costs_the_server(served):
    """Refused at the edge or served; either way no 5xx and the instance stays ready."""
    inst, url = served
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        salted, clean = await asyncio.gather(
            c.post("/v1/completions", headers={"content-type": "application/json"},  # (an escaped "\ud800")
                   content=json.dumps(_body(PROMPTS[0], False, cache_salt="\ud800")).encode()),
            c.post("/v1/completions", json=_body(PROMPTS[1], False)))
        assert salted.status_code in (200, 400) and clean.status_code == 200
        assert (await c.get("/ready")).status_code == 200
    assert inst.engine.is_alive()
