"""The tool-call notation chosen from a chat template: a Hermes-style template (NousResearch
Hermes-2-Pro / Hermes-3) lists its tools as ``{"name": ..., "parameters": ...}`` and asks
for calls in ``<tool_call>`` tags; its calls are Hermes', not Llama 3's JSON. And the mistral parser's call ids go back
through Mistral's own template."""

from __future__ import annotations

from llmserve.models.chat_template import ChatTemplate
from llmserve.server.tool_formats import parser_for_template

HERMES_STYLE = (
    "{{- '<|im_start|>system\\nYou are a function calling AI model. <tools> ' }}"
    "{%- for tool in tools %}{{- '{\"type\": \"function\", \"function\": {\"name\": \"' + tool.function.name + '\"' }}"
    "{{- ', \"parameters\": ' }}{{- tool.function.parameters|tojson }}{{- '}}' }}{%- endfor %}"
    "{{- ' </tools>For each function call return a json object within <tool_call></tool_call> XML tags:\\n' }}"
    "{{- '<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-dict>}\\n</tool_call><|im_end|>\\n' }}"
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
)


def test_a_hermes_template_that_writes_parameters_is_read_as_hermes():
    assert parser_for_template(ChatTemplate(HERMES_STYLE).literal_text()) == "hermes"


def test_llama_and_mistral_templates_keep_their_parsers():
    assert parser_for_template('{"name": function name, "parameters": dictionary}') == "llama3_json"
    assert parser_for_template("<|python_tag|>") == "llama3_json"
    assert parser_for_template("[TOOL_CALLS] <tool_call>") == "mistral"


def test_mistral_call_ids_come_back_through_mistrals_own_template():
    """The next turn sends the call and its result back: Mistral's template takes ids of nine
    letters and digits only, so the mistral parser's ids are those (as vLLM's are)."""
    import json
    import re
    from pathlib import Path

    from llmserve.server.tool_formats import tool_call_parser

    p = tool_call_parser("mistral")
    p.feed('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]')
    p.finish()
    (call,) = p.tool_calls()
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"])
    source = (Path(__file__).parents[1] / "fixtures/chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja")
    back = {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
    messages = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "tool_calls": [back]},
                {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    prompt = ChatTemplate(source.read_text()).render(messages, bos_token="<s>", eos_token="</s>")
    assert f'"id": "{call["id"]}"' in prompt
