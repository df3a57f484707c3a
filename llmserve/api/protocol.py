"""OpenAI request models: every field typed and bounded, unknown fields refused.

The bounds are the edge's; ``SamplingParams`` checks again for callers of the
Python API. Where OpenAI documents a range it is used (temperature [0, 2],
penalties [-2, 2], top_p (0, 1]); the rest are caps that keep one request's cost
bounded (see ``Limits``). A field OpenAI defines that llmserve does not implement
is refused by name in ``UNSUPPORTED`` rather than ignored; a field OpenAI defines
as having no effect here (``store: false``, ``metadata``, ``service_tier``) is
accepted and listed in ``NO_OP``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmserve.api.errors import APIError, FieldError
from llmserve.api.structured import (Choices, Grammar, Regex, ResponseFormat, StructuredOutputs, ToolCalls,
                                     ToolChoice, Tools, check_json_schema)


class Limits:
    """Caps on one request's shape (the body itself is capped by the servers)."""

    MESSAGES = 1024          # a long agent transcript is a few hundred
    CONTENT_PARTS = 256      # per message
    STOP = 16                # OpenAI allows 4; vLLM has no cap; each is searched every step
    STOP_CHARS = 256
    STOP_TOKEN_IDS = 256
    PROMPTS = 1024           # prompts in one completions request (servers may cap lower)
    TOKEN_ID = 2**31 - 1     # beyond any vocabulary; keeps ids in int32
    MAX_TOKENS = 1 << 20     # the engine caps again at the model's context
    N = 128
    LOGPROBS = 20
    NAME_CHARS = 256         # model, user, cache_salt, message name
    METADATA = 16
    SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes
    PRIORITY_CHARS = 32
    DEPTH = 32               # JSON nesting; real requests use under 8
    LOGIT_BIAS = 1024        # entries; OpenAI sets no cap, each is applied every step


Name = Annotated[str, Field(max_length=Limits.NAME_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=Limits.TOKEN_ID)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
StopText = Annotated[str, Field(min_length=1, max_length=Limits.STOP_CHARS)]

# Known OpenAI (or vLLM) fields llmserve refuses by name: 400, code unsupported_parameter.
UNSUPPORTED: dict[str, str] = {
    "functions": "the deprecated functions field is not supported (use tools)",
    "function_call": "the deprecated function_call field is not supported (use tool_choice)",
    "suffix": "suffix (insertion) is not supported",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "reasoning_effort is not supported by this model",
    "web_search_options": "web search is not supported",
    "prompt_logprobs": "prompt_logprobs is not supported",
    "guided_decoding_backend": "choosing the guided decoding backend is not supported (xgrammar is used)",
    "guided_whitespace_pattern": "guided_whitespace_pattern is not supported",
    # vLLM's sampling extensions not implemented
    "echo": "echo is not supported on chat completions (it is on completions)",
    "use_beam_search": "beam search is not supported",
    "bad_words": "bad_words is not supported (logit_bias bans tokens)",
    "allowed_token_ids": "allowed_token_ids is not supported (logit_bias or a grammar limits tokens)",
    "length_penalty": "length_penalty is not supported (it applies to beam search only)",
    # OpenAI's prompt-cache controls and moderation: the prefix cache has no breakpoints or lifetimes to set
    "prompt_cache_options": "prompt_cache_options is not supported (the prefix cache reuses shared prefixes by itself)",
    "prompt_cache_retention": "prompt_cache_retention is not supported (cached prefixes live while memory allows)",
    "moderation": "moderation is not supported",
}


def unsupported(key: str, param: str | None = None) -> APIError:
    """The refusal of a field named in ``UNSUPPORTED`` (raised from a validator: pydantic passes it on)."""
    return APIError(400, f"{UNSUPPORTED[key]} by llmserve ({key!r})", param=param or key, code="unsupported_parameter")
# Chat template variables the request sets itself: chat_template_kwargs may not.
TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
                                "bos_token", "eos_token"})


def _check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    if kwargs and (taken := sorted(set(kwargs) & TEMPLATE_VARIABLES)):
        raise FieldError("chat_template_kwargs", f"chat_template_kwargs may not set {', '.join(taken)} "
                                                 "(the request's own fields do)")


# Accepted, documented as having no effect on generation (docs/openai-api.md).
NO_OP = ("store", "metadata", "service_tier", "user", "modalities", "safety_identifier", "prompt_cache_key")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk carries the usage so far (the prompt's count
    # from the first one on: what Anthropic's message_start reports)
    continuous_usage_stats: bool = False
    # OpenAI's: chunks carry no obfuscation padding here, so only false (which asks for none) is taken
    include_obfuscation: Literal[False] | None = None


class _SamplingFields(_Strict):
    model: Name | None = None
    max_tokens: Annotated[int, Field(ge=1, le=Limits.MAX_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=Limits.N)] = 1
    best_of: Annotated[int, Field(ge=1, le=Limits.N)] | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=Limits.STOP)] | None = None
    seed: Annotated[int, Field(ge=Limits.SEED_MIN, le=Limits.SEED_MAX)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Name | None = None
    # OpenAI's no-ops here (NO_OP)
    store: Literal[False] | None = None  # nothing is stored, so store: true is refused
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                        Field(max_length=Limits.METADATA)] | None = None
    service_tier: Literal["auto", "default"] | None = None
    # vLLM's extensions
    top_k: Annotated[int, Field(ge=-1, le=Limits.TOKEN_ID)] | None = None  # -1 or 0: off
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # Far from 0 and inf in fp32: logits are divided or multiplied by it.
    repetition_penalty: Annotated[float, Field(ge=0.01, le=100.0)] | None = None
    ignore_eos: bool = False
    # no EOS, stop token or stop string before this many output tokens; <= max_tokens (SamplingParams checks)
    min_tokens: Annotated[int, Field(ge=0, le=Limits.MAX_TOKENS)] = 0
    use_beam_search: bool = False  # vLLM's; only false, its default (UNSUPPORTED names it)
    stop_token_ids: Annotated[list[TokenId], Field(max_length=Limits.STOP_TOKEN_IDS)] | None = None
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | \
        Annotated[str, Field(max_length=Limits.PRIORITY_CHARS)] | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=Limits.NAME_CHARS)] | None = None
    include_stop_str_in_output: bool = False
    # vLLM's: keep the prompt's last N tokens (-1: max_model_len; 0 and over max_model_len are 400s)
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=Limits.MAX_TOKENS)] | None = None
    skip_special_tokens: bool = True
    return_token_ids: bool = False  # each choice (stream chunk) carries its new token ids
    # Output another instance already streamed: this request continues it (sent by the
    # gateway when an instance died mid-stream; the gateway refuses it from clients).
    resume_token_ids: Annotated[list[TokenId], Field(min_length=1, max_length=Limits.MAX_TOKENS)] | None = None
    logit_bias: Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")],
                               Annotated[float, Field(ge=-100.0, le=100.0)]],
                          Field(max_length=Limits.LOGIT_BIAS)] | None = None
    # Constrained outputs (api/structured.py); at most one of them per request.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: Regex | None = None
    guided_choice: Choices | None = None
    guided_grammar: Grammar | None = None

    _schema = field_validator("guided_json")(classmethod(lambda cls, v: v if v is None else check_json_schema(v)))

    @field_validator("logit_bias")
    @classmethod
    def _bias_ids(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v and any(int(k) > Limits.TOKEN_ID for k in v):
            raise ValueError(f"token ids must be at most {Limits.TOKEN_ID}")
        return v

    @model_validator(mode="after")
    def _fields_together(self) -> "_SamplingFields":
        if self.use_beam_search:
            raise unsupported("use_beam_search")
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "stream_options is only allowed when stream is true")
        if self.best_of is not None:
            if self.best_of < self.n:
                raise FieldError("best_of", "best_of must be at least n")
            if self.stream and self.best_of > self.n:
                raise FieldError("best_of", "best_of greater than n cannot be streamed (the best are known only at the end)")
        given = self.constraints()
        if len(given) > 1:
            raise FieldError(given[1], f"give at most one output constraint, got {', '.join(given)}")
        return self

    def constraints(self) -> list[str]:
        """The output constraints this request sets (fields by name)."""
        given = [k for k in ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
                 if getattr(self, k) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            given.append("response_format")
        return given


class CompletionRequest(_SamplingFields):
    prompt: Annotated[str, Field(min_length=1)] \
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=Limits.PROMPTS)] \
        | TokenIds \
        | Annotated[list[TokenIds], Field(min_length=1, max_length=Limits.PROMPTS)]
    logprobs: Annotated[int, Field(ge=0, le=Limits.LOGPROBS)] | None = None
    echo: bool = False

    @model_validator(mode="after")
    def _echo(self) -> "CompletionRequest":
        if self.echo and self.logprobs is not None:
            raise FieldError("echo", "echo with logprobs is not supported (prompt logprobs are not computed)")
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


_PARTS = {"text": TextPart, "refusal": RefusalPart}


def _check_part_types(parts: Any) -> Any:
    """Name the unsupported part types (image_url, input_audio, file) plainly."""
    if isinstance(parts, list):
        for p in parts:
            kind = p.get("type") if isinstance(p, dict) else None
            if isinstance(kind, str) and kind not in _PARTS:
                raise ValueError(f"content part type {kind!r} is not supported: this model reads text only")
    return parts


class ChatMessage(_Strict):
    # ipython: Llama 3.x's tool result role (its templates render results under it)
    role: Literal["system", "developer", "user", "assistant", "tool", "ipython"]
    content: str | Annotated[list[TextPart | RefusalPart], Field(min_length=1, max_length=Limits.CONTENT_PARTS)] | None = None
    name: Annotated[str, Field(max_length=64)] | None = None
    refusal: str | None = None  # an assistant turn as OpenAI returns it
    annotations: Annotated[list[Any], Field(max_length=Limits.CONTENT_PARTS)] | None = None  # (same; not rendered)
    tool_calls: ToolCalls | None = None  # an assistant turn that called tools
    tool_call_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # a tool's result
    # an assistant turn's reasoning, by vLLM's old and new names (Qwen3's template reads it)
    reasoning_content: str | None = None
    reasoning: str | None = None

    _parts = field_validator("content", mode="before")(classmethod(lambda cls, v: _check_part_types(v)))

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, v: Any) -> Any:
        """null is a field not given here too: ``message.model_dump()`` of an SDK answer sends
        ``audio``, ``function_call``, ``tool_calls`` ... as null. Set, the first two are refused by name."""
        if not isinstance(v, dict):
            return v
        v = {k: x for k, x in v.items() if x is not None}
        for key, why in (("audio", "audio output is not supported"),
                         ("function_call", "the deprecated function_call is not supported (use tool_calls)")):
            if key in v:
                raise FieldError(key, why, code="unsupported_parameter")
        return v

    @model_validator(mode="after")
    def _tool_fields(self) -> "ChatMessage":
        if self.content is None and self.role != "assistant":  # (an assistant's may be null: it called tools)
            raise FieldError("content", f"a {self.role} message needs content")
        if self.tool_calls is not None and self.role != "assistant":
            raise FieldError("tool_calls", "only assistant messages carry tool_calls")
        if (self.tool_call_id is not None and self.role != "ipython") != (self.role == "tool"):
            raise FieldError("tool_call_id", "a tool message needs tool_call_id, and only a tool (or ipython) "
                             "message has one")
        for key in ("reasoning_content", "reasoning"):
            if getattr(self, key) is not None and self.role != "assistant":
                raise FieldError(key, f"only assistant messages carry {key}")
        if None not in (self.reasoning, self.reasoning_content) and self.reasoning != self.reasoning_content:
            raise FieldError("reasoning", "reasoning and reasoning_content differ (they are one field's two names)")
        return self

    def text(self) -> str:
        """The message's text: text parts joined by newlines, as vLLM joins them (refusals are
        not prompt text)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template sees it; developer is the newer name of system."""
        msg: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": self.text()}
        if self.name is not None:
            msg["name"] = self.name
        if self.tool_calls is not None:
            msg["tool_calls"] = [c.for_template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if (reasoning := self.reasoning_content if self.reasoning is None else self.reasoning) is not None:
            msg["reasoning_content"] = reasoning
        return msg


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=Limits.MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=Limits.MAX_TOKENS)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=Limits.LOGPROBS)] | None = None
    add_generation_prompt: bool = True
    # vLLM's: the prompt ends inside the final message, which the model continues (a prefill)
    continue_final_message: bool = False
    modalities: list[Literal["text"]] | None = None
    # OpenAI's, no effect here (as on /v1/responses): the prefix cache needs no key
    safety_identifier: Name | None = None
    prompt_cache_key: Name | None = None
    verbosity: Literal["medium"] | None = None  # OpenAI's default, the only one this model has
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # extra variables for the chat template (Qwen3's enable_thinking), as in vLLM
    chat_template_kwargs: Annotated[dict[str, Any], Field(max_length=64)] | None = None

    @model_validator(mode="after")
    def _template_kwargs(self) -> "ChatCompletionRequest":
        _check_template_kwargs(self.chat_template_kwargs)
        if self.continue_final_message and self.add_generation_prompt:  # (vLLM refuses both too)
            raise FieldError("continue_final_message", "continue_final_message needs add_generation_prompt false "
                             "(the final message is continued, not followed by a new turn)")
        return self

    @model_validator(mode="after")
    def _tools(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs is only allowed when logprobs is true")
        if self.tool_choice is not None and self.tools is None:
            raise FieldError("tool_choice", "tool_choice is only allowed when tools are specified")
        if "parallel_tool_calls" in self.model_fields_set and self.tools is None:
            raise FieldError("parallel_tool_calls", "parallel_tool_calls is only allowed when tools are specified")
        if self.tools is not None:
            names = [t.function.name for t in self.tools]
            if len(set(names)) != len(names):
                raise FieldError("tools", "function names must be unique")
            choice = self.tool_choice
            if not isinstance(choice, str) and choice is not None and choice.function.name not in names:
                raise FieldError("tool_choice", f"tool_choice names the function {choice.function.name!r}, which is not in tools")
            if self.tool_mode != "none" and self.constraints():
                raise FieldError(self.constraints()[0], f"{self.constraints()[0]} cannot be combined with tools unless tool_choice is 'none'")
        return self

    @property
    def tool_mode(self) -> str:
        """'none', 'auto', 'required' or 'named' (tool_choice names a function)."""
        if self.tools is None:
            return "none"
        c = self.tool_choice
        return "auto" if c is None else c if isinstance(c, str) else "named"


class ThreadsRequest(_Strict):
    """``POST /engine/threads``: the engine's torch threads (an operator's, or serve's, call)."""

    threads: Annotated[int, Field(ge=1, le=1024)]


class TokenizeRequest(_Strict):
    model: Name | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=Limits.MESSAGES)] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: true for a prompt, false with messages
    add_generation_prompt: bool = True
    tools: Tools | None = None  # with messages: the chat prompt's tokens, tools rendered as chat does
    chat_template_kwargs: Annotated[dict[str, Any], Field(max_length=64)] | None = None
    continue_final_message: bool = False  # vLLM's, as on chat: the prompt ends inside the final message
    return_token_strs: bool | None = False  # vLLM's: the answer's token_strs, the tokens as strings

    @model_validator(mode="after")
    def _template_kwargs(self) -> "TokenizeRequest":
        _check_template_kwargs(self.chat_template_kwargs)
        if self.continue_final_message:
            if self.messages is None:  # (a plain prompt has no final message to continue)
                raise FieldError("continue_final_message", "continue_final_message is only allowed with messages")
            if self.add_generation_prompt:  # (vLLM refuses both too)
                raise FieldError("continue_final_message", "continue_final_message needs add_generation_prompt "
                                 "false (the final message is continued, not followed by a new turn)")
        return self


class DetokenizeRequest(_Strict):
    model: Name | None = None
    tokens: Annotated[list[TokenId], Field(max_length=Limits.MAX_TOKENS)]
