"""The server's choice of chat template, tool-call notation and reasoning split, and the
responses they give, whole and streamed, without a server process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer as RustTokenizer

from llmserve.api.errors import APIError
from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest
from llmserve.engine.outputs import CompletionOutput, RequestOutput
from llmserve.models.tokenizer import Tokenizer
from llmserve.server.config import ServerConfig
from llmserve.server.responses import ChoiceWriter, ResponseMeta
from llmserve.server.serving import OpenAIServing
from tests.helpers import CHATML_TEMPLATE, tiny_tokenizer_json

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "chat_templates"
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def _serving(template: str, **config) -> tuple[OpenAIServing, Tokenizer]:
    tok = Tokenizer(RustTokenizer.from_str(tiny_tokenizer_json(384)), eos_token="<|im_end|>", chat_template=template)
    return OpenAIServing(SimpleNamespace(tokenizer=tok), ServerConfig(**config), "tiny"), tok


def _prompt(serving: OpenAIServing, tok: Tokenizer, body: dict) -> str:
    r = validate(body, ChatCompletionRequest)
    return tok.decode(serving.encode_chat(r.messages, True, None, r.chat_template_kwargs), skip_special_tokens=False)


def test_chat_template_kwargs_reach_the_template():
    serving, tok = _serving(QWEN3)
    assert _prompt(serving, tok, {**CHAT, "chat_template_kwargs": {"enable_thinking": False}}).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert _prompt(serving, tok, CHAT).endswith("<|im_start|>assistant\n")
    with pytest.raises(APIError) as e:
        validate({**CHAT, "chat_template_kwargs": {"messages": []}}, ChatCompletionRequest)
    assert e.value.status == 400 and "chat_template_kwargs may not set messages" in str(e.value.message)


def test_chat_template_flag_overrides_the_models(tmp_path):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    serving, tok = _serving(CHATML_TEMPLATE, chat_template=str(tmp_path / "t.jinja"))
    assert _prompt(serving, tok, CHAT) == "[user] Hi\n"
    serving, tok = _serving(CHATML_TEMPLATE, chat_template="<{{ messages[0].content }}>")
    assert _prompt(serving, tok, CHAT) == "<Hi>"


@pytest.mark.parametrize("template,parser", [("Qwen-Qwen3-0.6B", "hermes"), ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
                                             ("meta-llama-Llama-3.2-3B-Instruct", "llama3_json")])
def test_tool_call_parser_follows_the_models_template(template, parser):
    serving, _ = _serving((TEMPLATES / f"{template}.jinja").read_text())
    assert serving.formats.tool_parser == parser
    assert serving.formats.tool_parser_for("required") == "hermes"  # the grammar writes Hermes
    serving, _ = _serving((TEMPLATES / f"{template}.jinja").read_text(), tool_call_parser="mistral")
    assert serving.formats.tool_parser == "mistral"


def _out(text: str, delta: str, finished: bool) -> RequestOutput:
    c = CompletionOutput(0, text if finished else "", [], "stop" if finished else None, delta_text=delta)
    return RequestOutput("r", [], [c], finished)


TEXT = '<think>Paris, so weather.</think>[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'


def test_reasoning_then_tool_call_whole_and_streamed():
    meta = ResponseMeta("id", 0, "tiny", True, 1, False, tool_calls=True, tool_parser="mistral",
                        reasoning_parser="qwen3")
    msg = ChoiceWriter(0, meta, None).final(_out(TEXT, TEXT, True))
    assert msg["message"]["reasoning_content"] == "Paris, so weather."
    assert msg["message"]["content"] is None and msg["finish_reason"] == "tool_calls"
    assert [c["function"] for c in msg["message"]["tool_calls"]] == [{"name": "get_weather",
                                                                     "arguments": '{"city": "Paris"}'}]
    w = ChoiceWriter(0, meta, None)
    pieces = [TEXT[i:i + 5] for i in range(0, len(TEXT), 5)]
    choices = [ch for i, p in enumerate(pieces) for ch in w.chunks(_out(TEXT, p, i == len(pieces) - 1))]
    deltas = [ch["delta"] for ch in choices]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Paris, so weather."
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city": "Paris"}'
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_messages_thinking_is_taken_by_a_template_with_enable_thinking_or_as_the_model_does():
    """/v1/messages' thinking (its header): Qwen3's switch takes either; without one, a 400
    unless the ask is what the model does anyway."""
    from llmserve.server.formats import OutputFormats

    class Tok:
        def __init__(self, switch: bool) -> None:
            self.switch = switch

        def template_reads(self, name: str, tools: bool = True) -> bool:
            return self.switch and name == "enable_thinking"

    for parser in (None, "qwen3"):
        for ask in ("enabled", "disabled"):
            OutputFormats("hermes", parser).check_thinking(Tok(True), {"x-llmserve-thinking": ask}, False)
    OutputFormats("hermes", None).check_thinking(Tok(False), {"x-llmserve-thinking": "disabled"}, False)
    OutputFormats("hermes", "deepseek_r1").check_thinking(Tok(False), {"x-llmserve-thinking": "enabled"}, False)
    OutputFormats("hermes", None).check_thinking(Tok(False), {}, False)
    for parser, ask in ((None, "enabled"), ("deepseek_r1", "disabled")):
        with pytest.raises(APIError, match=f"thinking.type '{ask}' cannot be honoured"):
            OutputFormats("hermes", parser).check_thinking(Tok(False), {"x-llmserve-thinking": ask}, False)
