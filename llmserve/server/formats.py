"""Which chat template, tool-call notation and reasoning split a server uses: the model's
own unless ``--chat-template``, ``--tool-call-parser`` or ``--reasoning-parser`` say
otherwise. Decided once, at start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmserve.server.config import ServerConfig
from llmserve.server.tool_formats import parser_for_template


@dataclass(frozen=True, slots=True)
class OutputFormats:
    tool_parser: str  # how calls are read when the model is free to write them (tool_choice auto)
    reasoning_parser: str | None

    def tool_parser_for(self, tool_mode: str) -> str:
        # "required" and named calls are constrained to Hermes' notation (tool_calls.call_grammar)
        return self.tool_parser if tool_mode == "auto" else "hermes"


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
