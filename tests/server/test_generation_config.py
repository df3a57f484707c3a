"""``--generation-config`` (vLLM's flag and default): what a request leaves out of temperature,
top_p, top_k, min_p, repetition_penalty and max_tokens comes from the model's
generation_config.json (``auto``), from nowhere (``vllm``: OpenAI's defaults), or from a given
folder's file; what it gives always wins. The offline ``LLM`` takes the model's too."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest

from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest
from llmserve.models.generation_defaults import sampling_defaults
from llmserve.server.config import ServerConfig
from llmserve.server.serving import OpenAIServing
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

QWEN3_LIKE = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
              "repetition_penalty": 1.1, "max_new_tokens": 5, "eos_token_id": [2]}


def test_the_recommendations_are_read_as_vllm_reads_them():
    assert sampling_defaults(QWEN3_LIKE) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                                             "repetition_penalty": 1.1, "max_tokens": 5}
    # transformers' own defaults recommend nothing (its to_diff_dict drops them); nor does a bool
    assert sampling_defaults({"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0,
                              "do_sample": True, "top_k_bool": True}) == {}


def _params(defaults: dict, body: dict, chat: bool = False, **config):
    serving = OpenAIServing(SimpleNamespace(tokenizer=None, sampling_defaults=defaults), ServerConfig(**config), "t")
    kind = ChatCompletionRequest if chat else CompletionRequest
    base = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    return serving.sampling_params(validate({**base, **body}, kind), chat=chat)


def test_omitted_fields_take_the_models_and_given_ones_win(tmp_path):
    d = sampling_defaults(QWEN3_LIKE)
    sp = _params(d, {})
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty, sp.max_tokens) == (
        0.6, 0.95, 20, 0.05, 1.1, 5)
    sp = _params(d, {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "repetition_penalty": 1.0,
                     "max_tokens": 9})
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty, sp.max_tokens) == (
        0.0, 1.0, 0, 0.0, 1.0, 9)
    assert _params(d, {"max_completion_tokens": 3}, chat=True).max_tokens == 3
    assert _params(d, {}, chat=True).temperature == 0.6
    none = _params(d, {}, generation_config="vllm")  # OpenAI's defaults (completions: 16 tokens)
    assert (none.temperature, none.top_p, none.top_k, none.min_p, none.repetition_penalty, none.max_tokens) == (
        1.0, 1.0, 0, 0.0, 1.0, 16)
    assert _params({}, {}, chat=True).max_tokens is None  # chat without one: to the context's end
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3}))
    assert _params(d, {}, generation_config=str(tmp_path)).temperature == 0.3  # that folder's, not the model's
    with pytest.raises(ValueError, match="generation_config.json"):
        ServerConfig(generation_config=str(tmp_path / "nowhere"))


def test_the_models_max_tokens_is_a_cap_not_a_demand():
    """Like vLLM's: a request that asked for no length is never refused for the recommendation."""
    assert _params({"max_tokens": 32768}, {}, max_tokens_limit=4096).max_tokens == 4096
    assert _params({"max_tokens": 32768}, {}, chat=True, max_tokens_limit=4096).max_tokens == 4096
    with pytest.raises(Exception, match="at most 4096"):  # one the request gives is still checked
        _params({"max_tokens": 32768}, {"max_tokens": 5000}, max_tokens_limit=4096)


def test_an_engine_caps_the_models_max_tokens_at_the_contexts_room(tmp_path):
    folder = make_tiny_llama(tmp_path / "model", max_position_embeddings=64)
    (folder / "generation_config.json").write_text(json.dumps({"max_new_tokens": 100_000}))
    ep = start_engine(folder, tmp_path)
    try:
        for path, body in (("/v1/completions", {"prompt": "x y z"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
            r = httpx.post(ep.url + path, json={**body, "ignore_eos": True}, timeout=60)
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] == 64  # to the context's end
        given = httpx.post(ep.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100}, timeout=60)
        assert given.status_code == 400  # a length the request asks for that does not fit stays a 400
    finally:
        ep.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_llama(tmp_path_factory.mktemp("model"))
    (folder / "generation_config.json").write_text(json.dumps(QWEN3_LIKE))
    return folder


@pytest.mark.parametrize("flag, tokens", [((), 5), (("--generation-config", "vllm"), 16)])
def test_an_engine_takes_the_models_max_new_tokens_unless_told_not_to(tiny, tmp_path, flag, tokens):
    ep = start_engine(tiny, tmp_path, *flag)
    try:
        r = httpx.post(ep.url + "/v1/completions", json={"prompt": "x", "ignore_eos": True}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == tokens, r.text
    finally:
        ep.stop()
    log = ep.log()
    assert ("sampling defaults for what a request leaves out" in log) == (not flag)


def test_a_bad_generation_config_stops_the_start_in_one_line(tiny, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "llmserve.cli", "engine", "--model", str(tiny),
                           "--generation-config", str(tmp_path / "nowhere")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--generation-config" in proc.stderr and "Traceback" not in proc.stderr


def test_offline_llm_defaults_to_the_models_recommendations(tiny):
    from llmserve.engine.llm import LLM
    from llmserve.engine.sampling_params import SamplingParams

    llm = LLM(str(tiny), dtype="fp32")
    sp = llm.get_default_sampling_params()
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens) == (0.6, 0.95, 20, 5)
    out = llm.generate("x")[0].outputs[0]  # no SamplingParams: the model's (5 tokens at most)
    assert 1 <= len(out.token_ids) <= 5
    assert len(llm.generate("x", SamplingParams(max_tokens=8, ignore_eos=True))[0].outputs[0].token_ids) == 8
