"""Chat content given as text parts reads as the parts joined by newlines, as vLLM joins them."""

from __future__ import annotations

from llmserve.api.protocol import ChatCompletionRequest, ChatMessage


def test_text_parts_are_joined_by_newlines():
    msg = ChatMessage.model_validate({"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                                  {"type": "text", "text": "there"}]})
    assert msg.text() == "Hi\nthere"  # not "Hithere": two parts are two lines
    assert msg.for_template()["content"] == "Hi\nthere"


def test_refusal_parts_are_not_prompt_text_and_one_part_is_itself():
    msg = ChatMessage.model_validate({"role": "assistant", "content": [
        {"type": "text", "text": "a"}, {"type": "refusal", "refusal": "no"}, {"type": "text", "text": "b"}]})
    assert msg.text() == "a\nb"
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "only"}]}]})
    assert req.messages[0].for_template()["content"] == "only"
