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


# /v1/messages and /v1/responses: several text blocks of one message read as the chat
# completion with the same text parts would (joined by newlines), not run together.

def _prompt(body: dict) -> tuple[str, list[int]]:
    """The prompt text and ids the chat path makes of a chat body."""
    from tokenizers import Tokenizer as RustTokenizer

    from llmserve.api.parse import validate
    from llmserve.models.tokenizer import Tokenizer
    from llmserve.server.chat_prompt import encode_chat
    from tests.helpers import CHATML_TEMPLATE, tiny_tokenizer_json

    tok = Tokenizer(RustTokenizer.from_str(tiny_tokenizer_json(384)), eos_token="<|im_end|>",
                    chat_template=CHATML_TEMPLATE)
    r = validate(body, ChatCompletionRequest)
    msgs = [m.for_template() for m in r.messages]
    return (tok.apply_chat_template(msgs, r.add_generation_prompt, r.continue_final_message),
            encode_chat(tok, msgs, r.add_generation_prompt, None, {}, r.continue_final_message))


def _parts(*texts: str) -> list[dict]:
    return [{"type": "text", "text": t} for t in texts]


def test_messages_text_blocks_are_the_chat_text_parts():
    from llmserve.api import messages
    from llmserve.api.messages_protocol import MessagesRequest

    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "system": _parts("Be brief.", "Be kind."),
                                          "messages": [{"role": "user", "content": _parts("Hello", "world")},
                                                       {"role": "assistant", "content": _parts("Hi", "there")},
                                                       {"role": "user", "content": _parts("Say", "more")}]})
    chat = {"model": "m", "max_tokens": 8, "messages": [
        {"role": "system", "content": _parts("Be brief.", "Be kind.")},
        {"role": "user", "content": _parts("Hello", "world")},
        {"role": "assistant", "content": _parts("Hi", "there")},
        {"role": "user", "content": _parts("Say", "more")}]}
    got, want = _prompt(messages.chat_body(req)), _prompt(chat)
    assert "Hello\nworld" in got[0] and "Helloworld" not in got[0]
    assert got == want


def test_messages_tool_result_blocks_are_the_chat_text_parts():
    from llmserve.api import messages
    from llmserve.api.messages_protocol import MessagesRequest

    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": _parts("a", "b")}]}]})
    tool = [m for m in messages.chat_body(req)["messages"] if m["role"] == "tool"][0]
    assert ChatMessage.model_validate(tool).text() == "a\nb"


def test_responses_input_text_parts_are_the_chat_text_parts():
    from llmserve.api import responses
    from llmserve.api.responses_protocol import ResponsesRequest

    def inp(*texts: str) -> list[dict]:
        return [{"type": "input_text", "text": t} for t in texts]

    req = ResponsesRequest.model_validate({"model": "m", "input": [
        {"type": "message", "role": "developer", "content": inp("Be brief.", "Be kind.")},
        {"type": "message", "role": "user", "content": inp("Hello", "world")},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": inp("a", "b")}]})
    chat = {"model": "m", "messages": [
        {"role": "developer", "content": _parts("Be brief.", "Be kind.")},
        {"role": "user", "content": _parts("Hello", "world")},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": _parts("a", "b")}]}
    got, want = _prompt(responses.chat_body(req, [], responses.input_messages(req))), _prompt(chat)
    assert "Hello\nworld" in got[0] and "Helloworld" not in got[0]
    assert got == want
