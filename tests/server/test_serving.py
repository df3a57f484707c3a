"""OpenAIServing's prompt building, without a server: tools go through the model's
template when it renders them, else through tool_calls.py's format."""

from __future__ import annotations

from types import SimpleNamespace

from tokenizers import Tokenizer as RustTokenizer

from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest
from llmserve.models.tokenizer import Tokenizer
from llmserve.server.config import ServerConfig
from llmserve.server.serving import OpenAIServing
from tests.helpers import CHATML_TEMPLATE, tiny_tokenizer_json

NATIVE = ("{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
          "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}")
BODY = {"tools": [{"type": "function", "function": {"name": "get_weather"}}], "messages": [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18C"}]}


def _prompt(template: str, body: dict) -> str:
    tok = Tokenizer(RustTokenizer.from_str(tiny_tokenizer_json(384)), eos_token="<|im_end|>", chat_template=template)
    serving = OpenAIServing(SimpleNamespace(tokenizer=tok), ServerConfig(), "tiny")
    r = validate(body, ChatCompletionRequest)
    tools = [t.model_dump(exclude_none=True) for t in r.tools] if r.tools and r.tool_mode != "none" else None
    return tok.decode(serving.encode_chat(r.messages, True, tools), skip_special_tokens=False)


def test_a_template_that_renders_tools_gets_them_and_the_turns_as_they_are():
    text = _prompt(NATIVE, BODY)
    assert text.startswith('TOOLS:[{"type": "function", "function": {"name": "get_weather"}}]')
    assert '<assistant>[{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ' \
           '{"city": "Paris"}}}]' in text and "<tool>18C" in text
    assert "TOOLS:" not in _prompt(NATIVE, {**BODY, "tool_choice": "none"})


def test_a_template_without_tool_syntax_gets_the_hermes_format():
    text = _prompt(CHATML_TEMPLATE, BODY)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18C\n</tool_response>" in text
    assert "# Tools" not in _prompt(CHATML_TEMPLATE, {**BODY, "tool_choice": "none"})
