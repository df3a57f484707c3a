"""History messages as vLLM takes them: an assistant turn's reasoning (``reasoning_content``
or vLLM 0.10+'s ``reasoning``) reaches the template as ``reasoning_content``; Llama 3.x's
``ipython`` role is a tool result."""

from __future__ import annotations

import pytest

from llmserve.api.errors import APIError
from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest
from tests.helpers import CHATML_TEMPLATE
from tests.server.test_formats import QWEN3, TEMPLATES, _prompt, _serving

ASK, AGAIN = {"role": "user", "content": "Colour?"}, {"role": "user", "content": "Again?"}


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_an_assistant_turns_reasoning_reaches_qwen3s_template(key):
    serving, tok = _serving(QWEN3)
    turn = {"role": "assistant", "content": "Blue", key: "a colour"}
    # Qwen3 renders the reasoning of the turn after the last user query only
    last = _prompt(serving, tok, {"messages": [ASK, turn]})
    assert "<|im_start|>assistant\n<think>\na colour\n</think>\n\nBlue<|im_end|>\n" in last
    earlier = _prompt(serving, tok, {"messages": [ASK, turn, AGAIN]})
    assert "a colour" not in earlier and "<|im_start|>assistant\nBlue<|im_end|>" in earlier
    both = {"messages": [ASK, {**turn, "reasoning": "a colour", "reasoning_content": "a colour"}]}
    assert _prompt(serving, tok, both) == last


@pytest.mark.parametrize("msg,param", [
    ({"role": "user", "content": "x", "reasoning": "r"}, "reasoning"),
    ({"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "s"}, "reasoning"),
])
def test_misplaced_or_conflicting_reasoning_is_a_400(msg, param):
    with pytest.raises(APIError) as e:
        validate({"messages": [ASK, msg]}, ChatCompletionRequest)
    assert e.value.status == 400 and e.value.param.endswith(param)


LLAMA32 = (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("template,want", [
    (LLAMA32, '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny"<|eot_id|>'),  # the role it names
    (QWEN3, "<tool_response>\nsunny\n</tool_response>"),  # a template with no ipython: a tool result
    (CHATML_TEMPLATE, "<tool_response>\nsunny\n</tool_response>"),  # (one that renders no tools either)
])
def test_llama_ipython_role_is_a_tool_result(template, want):
    serving, tok = _serving(template)
    ask = {"role": "user", "content": "Weather in Paris?"}
    for result in ({"role": "ipython", "content": "sunny"}, {"role": "ipython", "content": "sunny", "tool_call_id": "call_1"}):
        r = validate({"messages": [ask, CALL, result], "tools": TOOLS}, ChatCompletionRequest)
        text = tok.decode(serving.encode_chat(r.messages, True, [t.model_dump(exclude_none=True) for t in r.tools]),
                          skip_special_tokens=False)
        assert want in text
