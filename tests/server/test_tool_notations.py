"""Tool calls in each family's own notation reach the parser, and come back through the
family's template: tool_choice auto is free text outside Hermes' notation (the grammar would
ban Mistral's ``[TOOL_CALLS]`` and Llama's ``<|python_tag|>``, special tokens), Mistral's
marker survives detokenising, calls get ids Mistral's template takes back in every mode,
Gemma 2 (no system role) takes tools, and a mistyped ``--chat-template`` path stops the start."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from llmserve.api.errors import APIError
from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest
from llmserve.models.chat_template import ChatTemplate
from llmserve.server.config import ServerConfig
from llmserve.server.responses import ChoiceWriter, ResponseMeta
from tests.server.test_formats import TEMPLATES, _out, _serving

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def _params(template: str, tool_choice: str):
    serving, _ = _serving(template)
    r = validate({"messages": ASK, "tools": [TOOL], "tool_choice": tool_choice}, ChatCompletionRequest)
    return serving, serving.sampling_params(r, chat=True)


def test_auto_calls_outside_hermes_are_read_from_free_text_with_special_tokens_kept():
    serving, sp = _params(_template("mistralai-Mistral-Nemo-Instruct-2407"), "auto")
    assert serving.formats.tool_parser == "mistral"
    assert sp.structured_outputs is None and sp.skip_special_tokens is False
    serving, sp = _params(_template("meta-llama-Llama-3.2-3B-Instruct"), "auto")
    assert serving.formats.tool_parser == "llama3_json" and sp.structured_outputs is None


def test_hermes_auto_and_every_required_call_stay_constrained():
    _, sp = _params(_template("Qwen-Qwen3-0.6B"), "auto")
    assert sp.structured_outputs.structural_tag["format"]["type"] == "triggered_tags"
    assert sp.skip_special_tokens is True
    _, sp = _params(_template("mistralai-Mistral-Nemo-Instruct-2407"), "required")
    assert sp.structured_outputs.structural_tag["format"]["type"] == "tags_with_separator"
    assert sp.skip_special_tokens is True  # Hermes' tags are text


def test_required_calls_on_a_mistral_template_get_ids_it_takes_back():
    """Required calls are written in Hermes' notation (the grammar), but the next turn renders
    them through Mistral's template, which refuses any id but nine letters and digits."""
    source = _template("mistralai-Mistral-Nemo-Instruct-2407")
    serving, _ = _serving(source)
    meta = ResponseMeta("id", 0, "tiny", True, 1, False, tool_calls=True,
                        tool_parser=serving.formats.tool_parser_for("required"), call_ids=serving.formats.call_ids())
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    (call,) = ChoiceWriter(0, meta, None).final(_out(text, text, True))["message"]["tool_calls"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"])
    back = {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
    turn = ASK + [{"role": "assistant", "tool_calls": [back]},
                  {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    assert f'"id": "{call["id"]}"' in ChatTemplate(source).render(turn, bos_token="<s>", eos_token="</s>")
    serving, _ = _serving(_template("Qwen-Qwen3-0.6B"))
    assert serving.formats.call_ids()().startswith("call_")
    # a writer told no ids keeps its parser's own (the mistral parser's are Mistral's)
    meta = ResponseMeta("id", 0, "tiny", True, 1, False, tool_calls=True, tool_parser="mistral")
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    (call,) = ChoiceWriter(0, meta, None).final(_out(text, text, True))["message"]["tool_calls"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"])


def test_gemma2_takes_tools_in_its_first_user_turn():
    """Gemma 2's template renders no tools and raises on a system message: the tools text we
    add goes ahead of the first user turn. A system message the caller sent is still theirs
    to get refused."""
    serving, tok = _serving(_template("google-gemma-2-2b-it"))
    r = validate({"messages": ASK, "tools": [TOOL]}, ChatCompletionRequest)
    prompt = tok.decode(serving.encode_chat(r.messages, True, [TOOL]), skip_special_tokens=False)
    first_user = prompt.split("<start_of_turn>user\n", 1)[1]
    assert first_user.index('"get_weather"') < first_user.index("Weather in Paris?")
    assert "<start_of_turn>system" not in prompt
    r = validate({"messages": [{"role": "system", "content": "Be brief."}] + ASK, "tools": [TOOL]},
                 ChatCompletionRequest)
    with pytest.raises(APIError) as e:
        serving.encode_chat(r.messages, True, [TOOL])
    assert e.value.status == 400


PHI4_MINI = ("{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")  # renders no tools


@pytest.mark.parametrize("parser,asked,past", [
    ("phi4_mini_json", "functools[{", 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("llama3_json", '{"name": <function-name>, "parameters"', '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("pythonic", "[function_name(argument=value", "[get_weather(city='Paris')]"),
    ("hermes", "<tool_call>\n{", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')])
def test_a_template_without_tools_asks_for_calls_in_the_notation_they_are_read_in(parser, asked, past):
    """``--tool-call-parser phi4_mini_json`` on Phi-4-mini's own template (which renders no
    tools): our tools text must ask for ``functools[...]``, not Hermes' tags the parser never
    reads; past calls are written the same way. Required calls stay Hermes' (the grammar's)."""
    serving, tok = _serving(PHI4_MINI, tool_call_parser=parser)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    r = validate({"messages": ASK + [{"role": "assistant", "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
                  "tools": [TOOL]}, ChatCompletionRequest)
    prompt = tok.decode(serving.encode_chat(r.messages, True, [TOOL], tool_mode="auto"), skip_special_tokens=False)
    assert asked in prompt.split("<|user|>")[0] and f"<|assistant|>{past}<|end|>" in prompt
    assert ("<tool_call>" in prompt) == (parser == "hermes")
    required = tok.decode(serving.encode_chat(r.messages, True, [TOOL], tool_mode="required"),
                          skip_special_tokens=False)
    assert "<tool_call>\n{" in required.split("<|user|>")[0]


def test_a_chat_template_path_that_does_not_exist_stops_the_start(tmp_path):
    missing = str(tmp_path / "templates" / "llama3.jinja")
    with pytest.raises(ValidationError, match="no such chat template file"):
        ServerConfig(chat_template=missing)
    (tmp_path / "t.jinja").write_text("{{ messages[0].content }}")
    assert ServerConfig(chat_template=str(tmp_path / "t.jinja")).chat_template
    assert ServerConfig(chat_template="{{ messages[0].content }}").chat_template  # inline Jinja
    p = subprocess.run([sys.executable, "-m", "llmserve.cli", "engine", "--model", str(tmp_path / "none.gguf"),
                        "--chat-template", missing], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no such chat template file" in p.stderr
    # one line, named by its flag, not pydantic's several
    assert p.stderr.strip().splitlines() == [f"llmserve: error: --chat-template: {missing!r}: no such chat template "
                                             "file (a template given inline has Jinja in it)"]


def test_a_special_token_opener_reaches_the_parser_through_a_live_engine(tmp_path):
    """A tiny Mistral whose ``[TOOL_CALLS]`` is a special token, as in Mistral's tokenizers:
    pushed to it by logit_bias, with tools offered and tool_choice auto, the token is neither
    banned by a grammar nor dropped by the detokenizer; the parser sees it (no call follows in
    one token, so it comes back as the text it was)."""
    import httpx
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as RustTokenizer

    from tests.family_models import make_family
    from tests.helpers import SPECIAL_TOKENS, tiny_tokenizer_json
    from tests.server.harness import start_engine

    folder = tmp_path / "mistral"
    make_family("mistral", folder, bos_token_id=1, eos_token_id=2, vocab_size=386)
    tok = RustTokenizer.from_str(tiny_tokenizer_json(384))
    tok.add_special_tokens([AddedToken("[TOOL_CALLS]", special=True, normalized=False),
                            AddedToken("[ARGS]", special=True, normalized=False)])
    opener = tok.token_to_id("[TOOL_CALLS]")
    (folder / "tokenizer.json").write_text(tok.to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIAL_TOKENS[1], "eos_token": SPECIAL_TOKENS[2], "unk_token": SPECIAL_TOKENS[0],
        "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": _template("mistralai-Mistral-Nemo-Instruct-2407")}))
    ep = start_engine(folder, tmp_path, "--served-model-name", "m")
    try:
        body = {"model": "m", "messages": ASK, "tools": [TOOL], "max_tokens": 1, "temperature": 0,
                "logit_bias": {str(opener): 100}}
        r = httpx.post(ep.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "[TOOL_CALLS]"
        r = httpx.post(ep.url + "/v1/chat/completions", json={**body, "tool_choice": "none"}, timeout=60)
        assert r.json()["choices"][0]["message"]["content"] == ""  # no tools: special tokens skipped as asked
    finally:
        ep.stop()
