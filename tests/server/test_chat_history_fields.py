"""History messages as vLLM takes them: an assistant turn's reasoning (``reasoning_content``
or vLLM 0.10+'s ``reasoning``) reaches the template as ``reasoning_content``."""

from __future__ import annotations

import pytest

from llmserve.api.errors import APIError
from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest
from tests.server.test_formats import QWEN3, _prompt, _serving

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
