"""The families' own chat templates render here exactly as transformers' ``apply_chat_template``
renders them: system prompts, tools, tool calls and results, the generation prompt and
template keyword arguments (Qwen3's ``enable_thinking``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmserve.models.chat_template import ChatTemplate, ChatTemplateError
from tests.helpers import SPECIAL_TOKENS, tiny_tokenizer_json

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "abc123xyz", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "abc123xyz", "name": "get_weather", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "21 degrees."},
    {"role": "user", "content": "And tomorrow?"},
]
PLAIN = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
         {"role": "user", "content": "Name a colour."}]
# template -> the conversations it is rendered with (Gemma 2 and Phi-3.5 take no tools or system)
CASES = {
    "Qwen-Qwen3-0.6B": [(CHAT, [WEATHER], {}), (PLAIN, None, {"enable_thinking": False}),
                        (PLAIN, None, {"enable_thinking": True})],
    "Qwen-Qwen2.5-7B-Instruct": [(CHAT, [WEATHER], {}), (PLAIN, None, {})],
    "meta-llama-Llama-3.2-3B-Instruct": [(CHAT, [WEATHER], {}), (PLAIN, None, {"date_string": "1 Dec 2026"})],
    "mistralai-Mistral-Nemo-Instruct-2407": [(CHAT, [WEATHER], {}), (PLAIN, None, {})],
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": [(PLAIN, None, {}), (CHAT[:2], None, {})],
    "google-gemma-2-2b-it": [(PLAIN, None, {}), (CHAT[:2], None, {})],  # a system turn: both refuse
    "microsoft-Phi-3.5-mini-instruct": [(PLAIN, None, {}), (CHAT[:2], None, {})],
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tiny_tokenizer_json(384)),
                                   bos_token=SPECIAL_TOKENS[1], eos_token=SPECIAL_TOKENS[2])


@pytest.mark.parametrize("name,case", [(n, i) for n, cases in CASES.items() for i in range(len(cases))])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_template_renders_as_transformers(hf_tokenizer, name, case, add_generation_prompt):
    source = (TEMPLATES / f"{name}.jinja").read_text()
    messages, tools, kwargs = CASES[name][case]
    try:
        ref = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=source,
                                               add_generation_prompt=add_generation_prompt, **kwargs)
    except Exception as e:  # the template's own raise_exception
        with pytest.raises(ChatTemplateError, match=str(e)[:40].replace("(", r"\(").replace(")", r"\)")):
            ChatTemplate(source).render(messages, add_generation_prompt, tools=tools, bos_token=SPECIAL_TOKENS[1],
                                        eos_token=SPECIAL_TOKENS[2], **kwargs)
        return
    got = ChatTemplate(source).render(messages, add_generation_prompt, tools=tools, bos_token=SPECIAL_TOKENS[1],
                                      eos_token=SPECIAL_TOKENS[2], **kwargs)
    assert got == ref
