"""A call forced by tool_choice (required or a named function) that max_tokens cuts before its
name is read: OpenAI's shape, not the Hermes markup the grammar began, on an instance and the gateway."""

from __future__ import annotations

import openai
import pytest

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_a_forced_call_cut_before_its_name_leaks_no_markup(host, choice):
    client = openai.OpenAI(base_url=host[0] + "/v1", api_key=host[1], max_retries=0, timeout=60)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "call f"}], max_tokens=3, temperature=0,
              tools=[TOOL], tool_choice=choice)
    c = client.chat.completions.create(**kw).choices[0]
    assert (c.finish_reason, c.message.content, c.message.tool_calls) == ("length", None, None)
    chunks = [ch.choices[0] for ch in client.chat.completions.create(**kw, stream=True) if ch.choices]
    assert "".join(ch.delta.content or "" for ch in chunks) == ""  # (it streamed '<tool_call>' at the end)
    assert chunks[-1].finish_reason == "length" and not any(ch.delta.tool_calls for ch in chunks)
