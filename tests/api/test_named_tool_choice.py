"""finish_reason of a forced call, as OpenAI's and vLLM's: "tool_calls" for tool_choice
required, "stop" for a named function (the caller chose the call), whole and streamed."""

from __future__ import annotations

import openai
import pytest

TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"enum": [1]}}, "required": ["x"], "additionalProperties": False}}}


@pytest.mark.parametrize("choice,want", [("required", "tool_calls"),
                                         ({"type": "function", "function": {"name": "f"}}, "stop")])
def test_a_forced_calls_finish_reason(host, choice, want):
    client = openai.OpenAI(base_url=host[0] + "/v1", api_key=host[1], max_retries=0, timeout=60)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "call f"}], max_tokens=150, temperature=0,
              tools=[TOOL], tool_choice=choice, parallel_tool_calls=False)
    c = client.chat.completions.create(**kw).choices[0]
    assert c.message.tool_calls[0].function.name == "f" and c.finish_reason == want
    chunks = [ch.choices[0] for ch in client.chat.completions.create(**kw, stream=True) if ch.choices]
    assert any(ch.delta.tool_calls for ch in chunks) and chunks[-1].finish_reason == want
