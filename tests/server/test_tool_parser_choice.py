"""The tool-call notation chosen from a chat template: a Hermes-style template (NousResearch
Hermes-2-Pro / Hermes-3) lists its tools as ``{"name": ..., "parameters": ...}`` and asks
for calls in ``<tool_call>`` tags; its calls are Hermes', not Llama 3's JSON."""

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
