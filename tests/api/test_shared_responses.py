"""Two gateway processes over one real Redis (``state.redis_url``): a response stored
through one is continued, read and deleted through the other, as replicas behind a
load balancer must; a store that goes away is a 503 for the request, and a wrong
password stops the gateway with one line."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.conftest import KEY
from tests.api.gateway_process import GatewayProcess
from tests.api.live import chat_text


@pytest.fixture()
def replicas(engine, redis_server, tmp_path):
    gws = [GatewayProcess(tmp_path / name, [engine.url], keys=[KEY], state={"redis_url": redis_server.url})
           for name in ("a", "b")]
    for g in gws:
        g.folder.mkdir()
        g.start()
    yield gws
    for g in gws:
        g.stop()


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_a_chain_started_on_one_replica_continues_on_the_other(replicas, engine, redis_server):
    a, b = _client(replicas[0]), _client(replicas[1])
    r1 = a.responses.create(model="tiny", input="first", max_output_tokens=6, temperature=0)
    r2 = b.responses.create(model="tiny", input="second", previous_response_id=r1.id, max_output_tokens=6,
                            temperature=0)
    conv = [{"role": "user", "content": "first"}, {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": "second"}]
    assert r2.output_text == chat_text(engine.url, conv, max_completion_tokens=6)  # b saw a's turn
    assert a.responses.retrieve(r2.id).output_text == r2.output_text
    # a streamed response is stored too, and another key does not see it
    events = list(a.responses.create(model="tiny", input="third", previous_response_id=r2.id,
                                     max_output_tokens=4, temperature=0, stream=True))
    r3 = events[-1].response
    assert b.responses.retrieve(r3.id).output_text == r3.output_text
    a.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(r1.id)
    # nothing in the state folders: the records are in Redis
    assert not (replicas[0].folder / "state" / "responses.db").exists()
    redis_server.stop()
    r = httpx.get(f"{replicas[1].url}/v1/responses/{r2.id}", headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
    redis_server.start()  # an empty Redis: the gateway reconnects, the old records are gone
    r4 = b.responses.create(model="tiny", input="again", max_output_tokens=3, temperature=0)
    assert a.responses.retrieve(r4.id).id == r4.id


def test_a_wrong_password_stops_the_gateway(engine, redis_server, tmp_path):
    bad = redis_server.url.replace(redis_server.password, "wrong")
    g = GatewayProcess(tmp_path, [engine.url], keys=[KEY], state={"redis_url": bad})
    with pytest.raises(RuntimeError, match="refused our credentials") as e:
        g.start()
    assert "wrong" not in str(e.value).split("refused")[0]  # the URL in the line is redacted
    g.stop()
