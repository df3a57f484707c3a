"""``probe_ready`` reads the engine's state word once, into the shared enum; ``judge``
acts on the enum."""

import json

import httpx
import pytest

from llmserve.autoscale.probe import Probe, judge, probe_ready
from llmserve.autoscale.providers.base import RunState, RunStatus
from llmserve.lifecycle import InstanceState as S

RUNNING = RunStatus(RunState.RUNNING)


def engine(ready_body, status=503, health_error=""):
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(503, json={"status": "dead", "error": health_error})
        body = ready_body if isinstance(ready_body, str) else json.dumps(ready_body)
        return httpx.Response(status, content=body, headers={"content-type": "application/json"})
    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


async def probe(body, status=503, **kw) -> Probe:
    async with engine(body, status, **kw) as client:
        return await probe_ready(client, "http://engine", RUNNING, 1.0)


@pytest.mark.parametrize("word,state", [("starting", S.STARTING), ("loading", S.STARTING), ("warming", S.WARMING),
                                        ("ready", S.READY), ("draining", S.DRAINING), ("failed", S.FAILED)])
async def test_each_engine_word_is_read_into_the_enum(word, state):
    p = await probe({"ready": word == "ready", "state": word}, 200 if word == "ready" else 503)
    assert p.engine_state is state


@pytest.mark.parametrize("body", [{"ready": False}, {"state": "booting"}, "not json"])
async def test_no_word_or_an_unknown_one_is_no_state(body):
    p = await probe(body)
    assert p.http_status == 503 and p.engine_state is None


async def test_a_failed_engine_without_a_reason_is_asked_for_one_on_health():
    p = await probe({"state": "failed"}, health_error="CUDA out of memory")
    assert p.engine_state is S.FAILED and p.error == "CUDA out of memory"


async def test_an_old_engine_saying_loading_stays_starting_then_warms_then_is_ready():
    assert judge(S.STARTING, await probe({"state": "loading"}), 5.0, 600.0) is None
    assert judge(S.STARTING, await probe({"state": "warming"}), 5.0, 600.0)[0] is S.WARMING
    assert judge(S.WARMING, await probe({"state": "ready"}, 200), 5.0, 600.0)[0] is S.READY


async def test_an_engine_failing_fails_a_starting_or_ready_instance():
    failed = await probe({"state": "failed", "error": "boom"})
    for state in (S.STARTING, S.WARMING, S.READY):
        target, reason = judge(state, failed, 5.0, 600.0)
        assert target is S.FAILED and "boom" in reason


def test_a_stopping_instance_is_not_judged_even_when_its_process_is_gone():
    gone = Probe(RunStatus(RunState.EXITED, 0, "exited with code 0"))
    assert judge(S.STOPPING, gone, 5.0, 600.0) is None
    assert judge(S.DRAINING, gone, 5.0, 600.0)[0] is S.FAILED


async def test_another_instance_answering_on_its_port_is_no_answer():
    """The free-port race: the port was free when chosen, another instance's server took it
    first. Its 200 must not make this instance ready."""
    body = {"ready": True, "state": "ready", "instance_id": "other-7"}
    async with engine(body, 200) as client:
        theirs = await probe_ready(client, "http://engine", RUNNING, 1.0, instance_id="mine-1")
        own = await probe_ready(client, "http://engine", RUNNING, 1.0, instance_id="other-7")
    assert theirs.http_status is None and "other-7" in theirs.error
    assert judge(S.WARMING, theirs, 5.0, 600.0) is None  # stays warming; never ready on their answer
    assert own.http_status == 200 and judge(S.WARMING, own, 5.0, 600.0)[0] is S.READY
