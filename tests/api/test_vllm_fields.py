"""vLLM's request fields llmserve does not implement are refused by name, as
docs/openai-api.md promises (400 unsupported_parameter naming the field), not as
unknown fields; their defaults that ask for nothing (use_beam_search false,
continuous_usage_stats false) are taken."""

from __future__ import annotations

import pytest

from llmserve.api.errors import APIError
from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("fields,param", [
    ({"echo": True}, "echo"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"bad_words": ["x"]}, "bad_words"),
    ({"allowed_token_ids": [1]}, "allowed_token_ids"),
    ({"length_penalty": 1.0}, "length_penalty"),
])
def test_unimplemented_vllm_fields_are_unsupported_parameter(fields, param):
    with pytest.raises(APIError) as e:
        validate({**CHAT, **fields}, ChatCompletionRequest)
    assert (e.value.status, e.value.code, e.value.param) == (400, "unsupported_parameter", param)
    if param != "echo":  # (completions implement echo)
        with pytest.raises(APIError) as e:
            validate({**COMPLETION, **fields}, CompletionRequest)
        assert (e.value.status, e.value.code, e.value.param) == (400, "unsupported_parameter", param)


def test_their_defaults_are_taken():
    r = validate({**CHAT, "use_beam_search": False, "stream": True,
                  "stream_options": {"include_usage": True, "continuous_usage_stats": False}}, ChatCompletionRequest)
    assert r.stream_options.include_usage and not r.use_beam_search
    assert validate({**COMPLETION, "echo": True, "use_beam_search": False}, CompletionRequest).echo


def test_min_tokens_is_taken_and_checked():
    """vLLM's min_tokens is implemented: taken on both endpoints, 0 by default, never negative."""
    assert validate({**CHAT, "min_tokens": 2}, ChatCompletionRequest).min_tokens == 2
    assert validate(COMPLETION, CompletionRequest).min_tokens == 0
    for model, body in ((ChatCompletionRequest, CHAT), (CompletionRequest, COMPLETION)):
        with pytest.raises(APIError) as e:
            validate({**body, "min_tokens": -1}, model)
        assert (e.value.status, e.value.param) == (400, "min_tokens")
