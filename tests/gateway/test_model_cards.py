"""The gateway's GET /v1/models: each model's name with the facts its instances report."""

import json

from llmserve.gateway.model_cards import FACT_KEYS, facts_of

from .app_harness import stack
from .fake_upstream import Behaviour


def _list(*entries: dict) -> bytes:
    return json.dumps({"object": "list", "data": list(entries)}).encode()


def test_facts_of_an_llmserve_a_vllm_and_a_llamacpp_list():
    ours = {"id": "m", "max_model_len": 4096, "family": "qwen3", "context_length": 40960}
    assert facts_of(_list({"id": "adapter", "family": "x"}, ours), "m") == {
        "max_model_len": 4096, "family": "qwen3", "context_length": 40960}
    # no entry of that name: the first one (a server that serves one model under its own name)
    assert facts_of(_list({"id": "vllm-name", "max_model_len": 2048}), "m") == {
        "max_model_len": 2048, "family": None, "context_length": None}
    llamacpp = {"id": "model.gguf", "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192, "n_vocab": 49152}}
    assert facts_of(_list(llamacpp), "m")["context_length"] == 8192
    # what is not a plain string or integer is not passed on
    assert facts_of(_list({"id": "m", "max_model_len": True, "family": {"x": 1}}), "m") == dict.fromkeys(FACT_KEYS)
    for bad in (b"not json", b"[]", b'{"data": 3}', _list()):
        assert facts_of(bad, "m") is None


def test_the_gateway_lists_what_its_instances_report():
    card = {"id": "upstream-name", "object": "model", "max_model_len": 4096, "family": "gemma3",
            "context_length": 32768}
    with stack({"v1": [Behaviour("a")], "v2": [Behaviour("b", models={"data": [card]})]},
               version_extra={"v2": {"upstream_model": "upstream-name", "api_key": "key-of-v2-upstream"}}) as s:
        r = s.client.get("/v1/models")
        assert r.status_code == 200, r.text
        [entry] = r.json()["data"]
        # v1's instance has no /v1/models (404): v2's answers, with v2's credentials
        assert entry["id"] == "chat" and entry["object"] == "model" and entry["parent"] is None
        assert {k: entry[k] for k in FACT_KEYS} == {"max_model_len": 4096, "family": "gemma3",
                                                   "context_length": 32768}
        asked = [h for h in s.fakes["b"].models_headers if "authorization" in h]
        assert asked and asked[-1]["authorization"] == "Bearer key-of-v2-upstream"
        s.fakes["b"].models = {"data": [{**card, "family": "changed"}]}
        assert s.client.get("/v1/models").json()["data"][0]["family"] == "gemma3"  # kept a while


def test_facts_are_null_when_no_instance_can_say():
    with stack({"v1": [Behaviour("a")]}) as s:
        r = s.client.get("/v1/models")
        assert r.status_code == 200
        [entry] = r.json()["data"]
        assert entry["id"] == "chat" and all(entry[k] is None for k in FACT_KEYS)
        # not kept: an instance that answers later is asked on the next list
        s.fakes["a"].models = {"data": [{"id": "chat", "family": "llama", "context_length": 8192}]}
        assert s.client.get("/v1/models").json()["data"][0]["family"] == "llama"


def test_hung_instances_cost_a_list_at_most_two_polls():
    card = {"data": [{"id": "chat", "family": "llama", "context_length": 8192}]}
    hung = [Behaviour(n, models=card, models_delay_s=3.0) for n in "ab"]
    with stack({"v1": [*hung, Behaviour("c", models=card)]}) as s:
        # the pool lists its instances in the order configured: a and b are asked, time out
        r = s.client.get("/v1/models")
        assert r.status_code == 200 and r.json()["data"][0]["family"] is None
        assert [s.fakes[n].models_asked for n in "abc"] == [1, 1, 0]


def test_the_gateway_retrieves_one_model_as_an_instance_does():
    """``client.models.retrieve("chat")`` through the gateway: the card, where it was a bare
    404 ``Not Found`` with no code; an unknown name is OpenAI's ``model_not_found``."""
    with stack({"v1": [Behaviour("a")]}, client_key="client-key-0123",
               auth={"admin_key": "admin-key-for-tests-0123456789", "api_keys": ["client-key-0123"]}) as s:
        r = s.client.get("/v1/models/chat")
        assert r.status_code == 200 and r.json() == s.client.get("/v1/models").json()["data"][0], r.text
        r = s.client.get("/v1/models/nope")
        err = r.json()["error"]
        assert r.status_code == 404 and (err["code"], err["param"]) == ("model_not_found", "model"), r.text
        assert s.client.get("/v1/models/chat", headers={"authorization": "Bearer wrong-key-0123"}).status_code == 401
