"""Anthropic's ``/v1/messages`` request: typed, bounded, the unimplemented refused by name.

``cache_control`` (on the request, a block or a tool) is accepted and has no
effect: the prefix cache reuses every shared prefix by itself. ``temperature``,
``top_p`` and ``top_k`` are taken although newer Anthropic SDKs no longer send
them (older ones and agents do). Claude-specific features (effort,
images, documents, server tools, workspaces) are refused by name. ``thinking``
is the template's ``enable_thinking`` (``messages.chat_body``); its budget is checked, not enforced.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.api.errors import FieldError
from llmserve.api.protocol import Limits, Name
from llmserve.api.structured import FunctionName, Schema, check_json_schema

UNSUPPORTED_FIELDS = {
    "mcp_servers": "MCP servers are not supported",
    "container": "containers (code execution) are not supported",
    "context_management": "context management is not supported",
    "diagnostics": "request diagnostics are not supported",
    "inference_geo": "inference_geo is not supported: the model runs where this server runs",
    "workspace_id": "workspaces are not supported",
    "user_profile_id": "user profiles are not supported",
}
_BLOCKS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


CacheControl = dict[str, Any] | None  # accepted, no effect (see the module docstring)


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None
    citations: list[Any] | None = None


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1, max_length=256)]
    name: Annotated[str, Field(max_length=64)]
    input: dict[str, Any]
    cache_control: CacheControl = None
    caller: dict[str, Any] | None = None  # echoed back as the SDK returned the block
    toolset_name: Annotated[str, Field(max_length=256)] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1, max_length=256)]
    content: str | Annotated[list[TextBlock], Field(max_length=Limits.CONTENT_PARTS)] | None = None
    is_error: bool = False
    cache_control: CacheControl = None
    toolset_name: Annotated[str, Field(max_length=256)] | None = None


class ThinkingBlock(_Strict):
    """An answer's thinking sent back: the assistant turn's reasoning (a template may render it)."""
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # (ours are empty: nothing to check)
    cache_control: CacheControl = None


class RedactedThinkingBlock(_Strict):
    """Claude's encrypted thinking sent back: accepted (clients echo an answer whole) and dropped."""
    type: Literal["redacted_thinking"]
    data: str
    cache_control: CacheControl = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
                  Field(discriminator="type")]


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(max_length=Limits.CONTENT_PARTS)]


class Tool(_Strict):
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    input_schema: Schema
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None

    @model_validator(mode="after")
    def _schema(self) -> "Tool":
        check_json_schema(self.input_schema)
        return self


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: Schema = Field(alias="schema")

    @model_validator(mode="after")
    def _schema(self) -> "OutputFormat":
        check_json_schema(self.schema_)
        return self


class OutputConfig(_Strict):
    format: OutputFormat | None = None
    effort: None = None  # the served models have one effort level


class Thinking(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None  # enabled only: checked as Anthropic does, not a cap
    display: Literal["summarized"] | None = None  # ("omitted" would withhold the thinking: not done)


class Metadata(_Strict):
    user_id: Name | None = None


def _refuse(v: Any) -> Any:
    """Name unsupported fields, block types and server tools before the union errors would."""
    if not isinstance(v, dict):
        return v
    for key, why in UNSUPPORTED_FIELDS.items():
        if v.get(key) is not None:
            raise FieldError(key, why)
    for i, msg in enumerate(v.get("messages") or []):
        content = msg.get("content") if isinstance(msg, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in _BLOCKS:
                raise FieldError(f"messages[{i}].content[{j}].type",
                                 f"content block type {kind!r} is not supported "
                                 "(text, tool_use, tool_result, thinking, redacted_thinking)")
    for i, tool in enumerate(v.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            raise FieldError(f"tools[{i}].type", f"server tool {kind!r} is not supported; only client tools are")
    return v


def _check_blocks(messages: list[Message]) -> None:
    """Refuse what Anthropic refuses rather than drop it: a call in a user turn, a result in an
    assistant turn or answering no earlier call, an empty turn but a final assistant one."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        if not m.content and not (m.role == "assistant" and i == len(messages) - 1):
            raise FieldError(f"messages[{i}].content", "all messages must have non-empty content "
                             "except for the optional final assistant message")
        if isinstance(m.content, str):
            continue
        for j, b in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(b, ThinkingBlock | RedactedThinkingBlock) and m.role != "assistant":
                raise FieldError(where, f"{b.type} blocks are only allowed in assistant messages")
            if isinstance(b, ToolUseBlock):
                if m.role != "assistant":
                    raise FieldError(where, "tool_use blocks are only allowed in assistant messages")
                calls.add(b.id)
            elif isinstance(b, ToolResultBlock):
                if m.role != "user":
                    raise FieldError(where, "tool_result blocks are only allowed in user messages")
                if b.tool_use_id not in calls:
                    raise FieldError(f"{where}.tool_use_id", f"tool_result block's tool_use_id {b.tool_use_id!r} "
                                     "answers no tool_use block of an earlier assistant message")


def _check_thinking(t: Thinking | None, max_tokens: int) -> None:
    """Anthropic's rules: a budget with ``enabled`` only, at least 1024 and under max_tokens."""
    if t is None:
        return
    if t.type != "enabled":
        for key in ("budget_tokens", "display"):
            if getattr(t, key) is not None:
                raise FieldError(f"thinking.{key}", f"thinking.{key} is only allowed with thinking.type 'enabled'")
        return
    if t.budget_tokens is None:
        raise FieldError("thinking.budget_tokens", "thinking.budget_tokens: Field required")
    if t.budget_tokens < 1024:
        raise FieldError("thinking.budget_tokens", "thinking.budget_tokens: Input should be greater than or equal to 1024")
    if t.budget_tokens >= max_tokens:
        raise FieldError("thinking.budget_tokens", "`max_tokens` must be greater than `thinking.budget_tokens`")


class MessagesRequest(_Strict):
    model: Name
    max_tokens: Annotated[int, Field(ge=1, le=Limits.MAX_TOKENS)]
    messages: Annotated[list[Message], Field(min_length=1, max_length=Limits.MESSAGES)]
    system: str | Annotated[list[TextBlock], Field(max_length=Limits.CONTENT_PARTS)] | None = None
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1, max_length=Limits.STOP_CHARS)]],
                              Field(max_length=Limits.STOP)] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # Anthropic's range
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=Limits.TOKEN_ID)] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    output_config: OutputConfig | None = None  # format: structured output by JSON schema
    cache_control: CacheControl = None
    speed: Literal["standard"] | None = None
    thinking: Thinking | None = None

    _refuse = model_validator(mode="before")(classmethod(lambda cls, v: _refuse(v)))

    @model_validator(mode="after")
    def _together(self) -> "MessagesRequest":
        c = self.tool_choice
        if c is not None and c.type == "tool":
            if c.name is None:
                raise FieldError("tool_choice.name", "tool_choice of type 'tool' needs name")
            if c.name not in [t.name for t in self.tools or []]:
                raise FieldError("tool_choice.name", f"tool_choice names {c.name!r}, which is not in tools")
        if c is not None and not self.tools:
            raise FieldError("tool_choice", "tool_choice requires tools")
        if self.output_config and self.output_config.format and self.tools and (c is None or c.type != "none"):
            raise FieldError("output_config.format", "output_config.format cannot be combined with tools unless "
                             "tool_choice is {\"type\": \"none\"} (one constraint on the output at a time)")
        _check_thinking(self.thinking, self.max_tokens)
        if self.messages[0].role != "user":
            raise FieldError("messages", "the first message must use the user role")
        last = self.messages[-1]
        tail = last.content if isinstance(last.content, str) else \
            next((b.text for b in reversed(last.content) if isinstance(b, TextBlock)), "")
        if last.role == "assistant" and tail != tail.rstrip():  # a prefill's last token would be a lone space
            raise FieldError(f"messages[{len(self.messages) - 1}].content",
                             "final assistant content cannot end with trailing whitespace")
        _check_blocks(self.messages)
        return self
