"""``/v1/models`` and ``/version`` as both SDKs read them, on an instance and the gateway: the
openai SDK's list and retrieve, and the anthropic SDK's (``type``, ``display_name``,
``created_at``, ``has_more``, ``first_id``, ``last_id`` were None or missing)."""

from __future__ import annotations

import datetime
import time

import anthropic
import httpx
import openai


def test_both_sdks_list_and_retrieve_the_models(host):
    url, key = host
    o = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    listed = o.models.list().data
    assert listed and all(m.object == "model" and m.owned_by == "llmserve" for m in listed)
    a = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=30)
    page = a.models.list()
    assert [m.id for m in page.data] == [m.id for m in listed]
    assert page.has_more is False and page.first_id == listed[0].id and page.last_id == listed[-1].id
    for m in page.data:
        assert m.type == "model" and m.display_name == m.id
        openai_created = next(x.created for x in listed if x.id == m.id)
        assert m.created_at == datetime.datetime.fromtimestamp(openai_created, datetime.UTC)
    one = a.models.retrieve(listed[0].id)
    assert (one.id, one.type) == (listed[0].id, "model") and one.created_at is not None
    assert o.models.retrieve(listed[0].id).id == listed[0].id


def test_a_models_created_time_holds_from_one_call_to_the_next(host):
    """One time per server (the model's), not the clock at each call: a list and a retrieve a
    second apart agree, as the two SDKs' views above must."""
    url, key = host
    o = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    first = {m.id: m.created for m in o.models.list().data}
    time.sleep(1.05)  # into the next second at least
    assert {m.id: m.created for m in o.models.list().data} == first
    assert {i: o.models.retrieve(i).created for i in first} == first


def test_an_instance_answers_vllms_version(engine):
    r = httpx.get(engine.url + "/version", timeout=10)
    from llmserve import __version__

    assert r.status_code == 200 and r.json() == {"version": __version__}
