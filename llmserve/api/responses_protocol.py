"""The ``/v1/responses`` request: every field typed, what is not implemented refused by name.

The sampling fields carry the chat request's bounds (``protocol.Limits``); the
translated chat body is validated again by the chat path, so the two can never
disagree about what is accepted. Output items a client sends back as input
(``message``, ``function_call``, ``function_call_output``, ``reasoning``) are
accepted as OpenAI's SDKs and agents echo them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.api.errors import APIError, FieldError
from llmserve.api.protocol import Limits, Name
from llmserve.api.structured import FunctionName, Schema, check_json_schema

# Fields and values OpenAI defines that llmserve refuses: 400 naming them.
UNSUPPORTED_FIELDS: dict[str, str] = {
    "background": "background mode is not supported (send the request and wait, or use the Batch API)",
    "conversation": "conversations are not supported (chain with previous_response_id)",
    "prompt": "prompt templates are not supported",
    "reasoning": "reasoning options are not supported: a served model reasons as its chat template has it",
    "include": "include is not supported (no built-in tools, no logprobs or encrypted reasoning to add)",
    "top_logprobs": "top_logprobs is not supported on /v1/responses (use /v1/chat/completions)",
    "max_tool_calls": "max_tool_calls is not supported",
    "stream_options": "stream_options is not supported on /v1/responses",
    "background_options": "background mode is not supported",
    "context_management": "context management is not supported (send the turns to keep)",
    "image": "image options are not supported: the served models make text only",
    "access_programs": "access programs are not supported",
}
# Their OpenAI defaults, which SDKs and agents send as they are: they ask for nothing, so they are taken.
NO_OP_DEFAULTS: dict[str, Any] = {"background": False, "include": [], "top_logprobs": 0}
BUILTIN_TOOLS = ("web_search", "web_search_preview", "file_search", "computer_use_preview", "code_interpreter",
                 "image_generation", "mcp", "local_shell", "shell", "apply_patch", "custom")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class InputText(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # output_text as the API returned it
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[InputText], Field(max_length=Limits.CONTENT_PARTS)]
    id: Annotated[str, Field(max_length=256)] | None = None
    status: str | None = None
    phase: Literal["commentary", "final_answer"] | None = None  # OpenAI asks clients to send it back; no effect


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    name: Annotated[str, Field(max_length=64)]
    arguments: Annotated[str, Field(max_length=1 << 20)]
    id: Annotated[str, Field(max_length=256)] | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    output: str | Annotated[list[InputText], Field(max_length=Limits.CONTENT_PARTS)]
    id: Annotated[str, Field(max_length=256)] | None = None
    status: str | None = None


class ReasoningPart(BaseModel):
    """A reasoning item's content part: a reasoning_text's text is read, any other kind ignored."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ReasoningItem(BaseModel):
    """Echoed back by agents: its reasoning_text parts are the next assistant turn's reasoning
    (a template may render them); an encrypted or summary-only one adds nothing."""

    model_config = ConfigDict(extra="allow")
    type: Literal["reasoning"]
    content: Annotated[list[ReasoningPart], Field(max_length=Limits.CONTENT_PARTS)] | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


def _no_nulls(item: Any) -> Any:
    """An item with its null fields (and its content parts') left out: null is a field not given,
    as at the top level, so ``output_item.model_dump()`` (``phase``, ``caller``: None) goes back as input."""
    if not isinstance(item, dict):
        return item
    item = {k: x for k, x in item.items() if x is not None}
    if isinstance(item.get("content"), list):
        item["content"] = [{k: x for k, x in p.items() if x is not None} if isinstance(p, dict) else p
                           for p in item["content"]]
    return item


def _item_kind(v: Any) -> Any:
    """Name an item type we do not take (item_reference, images, files) plainly."""
    if isinstance(v, list):
        for i, item in enumerate(v):
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if isinstance(kind, str) and kind not in ("message", "function_call", "function_call_output",
                                                       "reasoning"):
                raise FieldError(f"input[{i}].type", f"input item type {kind!r} is not supported")
            content = item.get("content") if isinstance(item, dict) and kind != "reasoning" else None
            for part in content if isinstance(content, list) else []:
                ptype = part.get("type") if isinstance(part, dict) else None
                if isinstance(ptype, str) and ptype not in ("input_text", "output_text"):
                    raise FieldError(f"input[{i}].content", f"content type {ptype!r} is not supported: "
                                     "this model reads text only")
    return v


class FunctionTool(_Strict):
    type: Literal["function"]
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: Schema | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> "FunctionTool":
        if self.parameters is not None:
            check_json_schema(self.parameters)
        return self


class NamedFunctionChoice(_Strict):
    type: Literal["function"]
    name: FunctionName


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: FunctionName | None = None
    schema_: Schema | None = Field(None, alias="schema")
    description: Annotated[str, Field(max_length=8192)] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> "TextFormat":
        if self.type == "json_schema":
            if self.schema_ is None or self.name is None:
                raise FieldError("schema", "text.format json_schema needs name and schema")
            check_json_schema(self.schema_)
        return self


class TextOptions(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only one this model has


class ResponsesRequest(_Strict):
    model: Name | None = None
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1,
                                                                                 max_length=Limits.MESSAGES)]
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=Limits.MAX_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                        Field(max_length=Limits.METADATA)] | None = None
    user: Name | None = None
    safety_identifier: Name | None = None
    prompt_cache_key: Name | None = None  # a hint: the prefix cache needs none
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = None  # "auto" would drop turns silently
    # llmserve's (as on chat): the priority class and a sampling seed
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | \
        Annotated[str, Field(max_length=Limits.PRIORITY_CHARS)] | None = None
    seed: Annotated[int, Field(ge=Limits.SEED_MIN, le=Limits.SEED_MAX)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for key, why in UNSUPPORTED_FIELDS.items():
                val = v.get(key)
                if val is None:
                    continue
                default = NO_OP_DEFAULTS.get(key, None)
                if type(val) is type(default) and val == default:  # (type: 0 is not false, nor false 0)
                    v = {k: x for k, x in v.items() if k != key}
                    continue
                # (APIError, not FieldError: pydantic passes it through, and its code is the one the docs name)
                raise APIError(400, f"{why} ({key!r})", param=key, code="unsupported_parameter")
            for i, tool in enumerate(v.get("tools") or []):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind != "function":
                    hint = "a built-in tool" if kind in BUILTIN_TOOLS else "a tool type"
                    raise FieldError(f"tools[{i}].type", f"{hint} ({kind!r}) is not supported; "
                                     "only function tools are")
            choice = v.get("tool_choice")
            if isinstance(choice, dict) and choice.get("type") not in ("function", None):
                raise FieldError("tool_choice", f"tool_choice type {choice.get('type')!r} is not supported")
            if isinstance(v.get("input"), list):
                v = {**v, "input": [_no_nulls(item) for item in v["input"]]}
            _item_kind(v.get("input"))
        return v

    @model_validator(mode="after")
    def _together(self) -> "ResponsesRequest":
        if isinstance(self.tool_choice, NamedFunctionChoice):
            if not self.tools or self.tool_choice.name not in [t.name for t in self.tools]:
                raise FieldError("tool_choice", f"tool_choice names {self.tool_choice.name!r}, which is not in tools")
        if self.tools:
            names = [t.name for t in self.tools]
            if len(set(names)) != len(names):
                raise FieldError("tools", "function names must be unique")
        return self
