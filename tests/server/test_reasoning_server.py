"""``--reasoning-parser`` end to end: a served model's output (forced here by a guided
choice) comes back split into ``reasoning_content`` and ``content``, whole and streamed,
and ``chat_template_kwargs`` reach the template."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.helpers import make_tiny_llama
from llmserve.server.reasoning_parser import END
from tests.server.harness import start_engine

ANSWER = "<think>a colour</think>Blue"
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if mood is defined %}[{{ mood }}]{% endif %}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), chat_template=TEMPLATE)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny",
                      "--reasoning-parser", "qwen3")
    yield ep
    ep.stop()


def test_reasoning_content_whole_and_streamed(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Colour?"}], max_tokens=40, temperature=0,
              extra_body={"guided_choice": [ANSWER]})
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    # both names, as vLLM 0.10+ (reasoning) and older clients (reasoning_content) read it
    assert (msg.reasoning_content, msg.reasoning, msg.content) == ("a colour", "a colour", "Blue")
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    for name in ("reasoning_content", "reasoning"):
        assert "".join(getattr(d, name, None) or "" for d in deltas) == "a colour"
    # the tokens up to </think> are reasoning, whole and streamed (OpenAI's usage field)
    n = r.usage.completion_tokens_details.reasoning_tokens
    assert 0 < n < r.usage.completion_tokens
    last = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))[-1]
    assert last.usage.completion_tokens_details.reasoning_tokens == n
    # the answer sent back as history (SDK's model_dump: both names) is taken
    again = [*kw["messages"], msg.model_dump(), {"role": "user", "content": "And?"}]
    assert client.chat.completions.create(**{**kw, "messages": again}).choices[0].message.content == "Blue"
    assert "".join(d.content or "" for d in deltas) == "Blue"


def test_reasoning_cut_short_is_the_same_whole_and_streamed_and_has_no_content(server):
    """Cut by max_tokens inside the reasoning (here mid-way through ``</think>``): what was
    held back as a possible tag is reasoning both ways, and the answer is null, not ""."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Colour?"}], "temperature": 0,
            "guided_choice": [ANSWER]}
    for n in range(1, 40):  # the first max_tokens that ends inside "</think>"
        msg = httpx.post(server.url + "/v1/chat/completions", json={**body, "max_tokens": n},
                         timeout=60).json()["choices"][0]["message"]
        if (msg["reasoning_content"] or "").startswith("a colour<"):
            break
    else:
        pytest.fail("no max_tokens ends inside the closing tag")
    assert msg["content"] is None and END.startswith(msg["reasoning_content"].removeprefix("a colour"))
    lines = httpx.post(server.url + "/v1/chat/completions", json={**body, "max_tokens": n, "stream": True},
                       timeout=60).text.splitlines()
    deltas = [json.loads(ln[6:])["choices"][0]["delta"] for ln in lines if ln.startswith("data: {")]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == ""


def test_chat_template_kwargs_reach_the_template(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
            "chat_template_kwargs": {"mood": "calm"}}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    plain = httpx.post(server.url + "/v1/chat/completions", json={**body, "chat_template_kwargs": None}, timeout=60)
    assert r.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]
    bad = httpx.post(server.url + "/v1/chat/completions",
                     json={**body, "chat_template_kwargs": {"tools": []}}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"
