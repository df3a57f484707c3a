"""Structured outputs after the reasoning, through a served model with Qwen3's own chat
template and ``--reasoning-parser deepseek_r1``: ``response_format`` constrains the content,
never the ``reasoning_content``; with ``enable_thinking`` false the template closes the
reasoning in the prompt and the whole output is the schema's. Tokens are steered by
``logit_bias``: "Z" (which no JSON object starts with) and ``</think>``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer

from tests.helpers import make_tiny_llama, tiny_tokenizer_json
from tests.server.harness import start_engine

TEMPLATE = (Path(__file__).parents[1] / "fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja").read_text()
SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["age", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), chat_template=TEMPLATE)
    rust = RustTokenizer.from_str(tiny_tokenizer_json(382))
    rust.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    rust.save(str(model / "tokenizer.json"))
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny",
                      "--reasoning-parser", "deepseek_r1")
    ep.tags = {t: rust.token_to_id(t) for t in ("Z", "<think>", "</think>")}
    yield ep
    ep.stop()


def _chat(server, seed: int, thinking: bool, stream: bool = False):
    tags = server.tags
    body = {"model": "tiny", "messages": [{"role": "user", "content": "How old?"}], "max_tokens": 150,
            "temperature": 1.0, "seed": seed, "logit_bias": {str(tags["Z"]): 9, str(tags["</think>"]): 7.5},
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            "chat_template_kwargs": {"enable_thinking": thinking}, "stream": stream}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def test_the_schema_holds_after_the_reasoning_only(server):
    free = 0
    for seed in range(4):
        r = _chat(server, seed, thinking=True)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        jsonschema.validate(json.loads(msg["content"]), SCHEMA)
        free += (msg["reasoning_content"] or "").startswith("Z")  # the grammar refuses "Z" there
    assert free >= 2


def test_streamed_reasoning_and_content(server):
    r = _chat(server, 1, thinking=True, stream=True)
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.text.splitlines()
              if line.startswith("data: {") and json.loads(line[6:])["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    jsonschema.validate(json.loads(content), SCHEMA)
    whole = _chat(server, 1, True).json()["choices"][0]["message"]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == (whole["reasoning_content"] or "")
    assert content == whole["content"]


def test_a_prompt_that_closed_the_reasoning_is_all_answer(server):
    for seed in range(2):
        msg = _chat(server, seed, thinking=False).json()["choices"][0]["message"]
        assert not msg.get("reasoning_content")
        jsonschema.validate(json.loads(msg["content"]), SCHEMA)
