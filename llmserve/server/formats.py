"""Which chat template, tool-call notation and reasoning split a server uses: the model's
own unless ``--chat-template``, ``--tool-call-parser`` or ``--reasoning-parser`` say
otherwise. Decided once, at start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from llmserve.api.errors import APIError
from llmserve.api.messages import THINKING_HEADER
from llmserve.server.config import ServerConfig
from llmserve.server.tool_formats import call_ids, parser_for_template

# Notations whose opening marker is a special token the detokenizer would drop (Mistral's
# [TOOL_CALLS]): with tool_choice auto their output keeps special tokens, as vLLM's parser asks.
_SPECIAL_OPENERS = ("mistral",)


@dataclass(frozen=True, slots=True)
class OutputFormats:
    tool_parser: str  # how calls are read when the model is free to write them (tool_choice auto)
    reasoning_parser: str | None

    def tool_parser_for(self, tool_mode: str) -> str:
        # "required" and named calls are constrained to Hermes' notation (tool_calls.call_grammar)
        return self.tool_parser if tool_mode == "auto" else "hermes"

    @property
    def constrains_auto(self) -> bool:
        """Whether tool_choice auto gets a grammar. Only Hermes' ``<tool_call>`` trigger is one we
        constrain after; any other notation is read from free text (as vLLM does for all), since
        the grammar would ban its opener (a special token: ``[TOOL_CALLS]``, ``<|python_tag|>``)."""
        return self.tool_parser == "hermes"

    def skip_special_tokens(self, asked: bool, tool_mode: str) -> bool:
        return asked and not (tool_mode == "auto" and self.tool_parser in _SPECIAL_OPENERS)

    def check_thinking(self, tokenizer: Any, headers: Any, tools: bool) -> None:
        """/v1/messages' ``thinking`` (its translation names it in a header): a template with
        Qwen3's ``enable_thinking`` switch takes it; without one, only what the model does anyway
        is taken (it thinks where the server has a reasoning parser, else not)."""
        ask = headers.get(THINKING_HEADER)
        if ask not in ("enabled", "disabled"):
            return
        try:
            if tokenizer is None or tokenizer.template_reads("enable_thinking", tools=tools):
                return
        except ValueError:  # no template: chat's own 400 follows
            return
        thinks = self.reasoning_parser is not None
        if (ask == "enabled") != thinks:
            does = "always thinks (--reasoning-parser)" if thinks else "returns no thinking (no --reasoning-parser)"
            raise APIError(400, f"thinking.type {ask!r} cannot be honoured: the model's chat template has no "
                                f"enable_thinking switch and the model {does}; leave thinking out",
                           param="thinking", code="unsupported_parameter")

    def call_ids(self) -> Callable[[], str]:
        """Ids in the shape the model's template accepts back in the next turn, whatever notation
        the calls were read in (Mistral's templates refuse any but nine letters and digits)."""
        return call_ids(self.tool_parser)


def output_formats(tokenizer: Any, config: ServerConfig) -> OutputFormats:
    if config.chat_template and tokenizer is not None:
        path = Path(config.chat_template)
        source = path.read_text(encoding="utf-8") if len(config.chat_template) < 4096 and path.is_file() \
            else config.chat_template
        tokenizer.set_chat_template(source)
    tool = config.tool_call_parser
    if tool is None:
        tool = "hermes"  # what our own tools prompt asks for (tool_calls.TOOLS_SYSTEM)
        try:
            if tokenizer is not None and tokenizer.template_reads("tools"):
                tool = parser_for_template(tokenizer.template_literal_text())
        except ValueError:  # no template (or one that does not compile): chat answers 400 later
            pass
    return OutputFormats(tool, config.reasoning_parser)
