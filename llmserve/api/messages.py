"""Anthropic's ``/v1/messages`` as a translation onto ``/v1/chat/completions``.

``system`` becomes the system turn; ``tool_use`` blocks the assistant's
``tool_calls``; ``tool_result`` blocks ``tool`` messages (before the user's text
of the same turn: they answer the previous turn's calls). Stop sequences are chat's
``stop``: the engine leaves the match out of the text (a stream's too) and chat's
``stop_reason`` names it (``stop_reason: stop_sequence`` and ``stop_sequence``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from llmserve.api.messages_protocol import MessagesRequest, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock

# ``thinking`` asked of chat: the instance checks that its template or model can do it
# (server/formats.py); the gateway forwards it, a client's own is dropped (``thinking_scope``)
THINKING_HEADER = "x-llmserve-thinking"

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def from_openai_error(status: int, body: Any) -> dict[str, Any]:
    err = body.get("error") if isinstance(body, dict) else None
    msg = err.get("message") if isinstance(err, dict) else None
    return error_body(status, str(msg or body))


def _content(blocks: str | list[Any] | None) -> str | list[dict[str, Any]] | None:
    """Text blocks as chat's text parts, None when there is no text: the chat path joins the
    parts (by newlines), so several blocks read as the same parts sent to chat would."""
    if blocks is None or isinstance(blocks, str):
        return blocks or None
    parts = [{"type": "text", "text": b.text} for b in blocks if isinstance(b, TextBlock)]
    return parts if any(p["text"] for p in parts) else None


def _result(b: ToolResultBlock) -> str | list[dict[str, Any]]:
    """A tool_result's content; is_error has no chat field: the model reads it in the text."""
    content = _content(b.content) or ""
    if not b.is_error:
        return content
    if isinstance(content, str):
        return "error: " + content
    return [{**content[0], "text": "error: " + content[0]["text"]}, *content[1:]]


def chat_body(req: MessagesRequest) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    system = _content(req.system)
    if system:
        msgs.append({"role": "system", "content": system})
    turns = req.messages
    if turns[-1].role == "assistant" and not turns[-1].content:
        turns = turns[:-1]  # an empty final assistant turn prefills nothing (Anthropic allows it)
    for m in turns:
        if isinstance(m.content, str):
            msgs.append({"role": m.role, "content": m.content})
            continue
        text = _content(m.content)
        if m.role == "assistant":
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                     for b in m.content if isinstance(b, ToolUseBlock)]
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking := "".join(b.thinking for b in m.content if isinstance(b, ThinkingBlock)):
                msg["reasoning_content"] = thinking
            if calls:
                msg["tool_calls"] = calls
            msgs.append(msg)
            continue
        msgs += [{"role": "tool", "tool_call_id": b.tool_use_id, "content": _result(b)}
                 for b in m.content if isinstance(b, ToolResultBlock)]
        if text or not any(isinstance(b, ToolResultBlock) for b in m.content):
            msgs.append({"role": "user", "content": text or ""})
    body: dict[str, Any] = {"model": req.model, "messages": msgs, "max_tokens": req.max_tokens, "stream": req.stream}
    last = msgs[-1]
    if last["role"] == "assistant" and last["content"] and "tool_calls" not in last:
        # Anthropic's prefill: the answer continues the final assistant text, in the same turn
        body.update(continue_final_message=True, add_generation_prompt=False)
    for key in ("temperature", "top_p", "top_k"):
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    if req.thinking is not None and req.thinking.type != "adaptive":  # (adaptive: the template's default)
        # Qwen3's switch, as SGLang maps it; a template without one ignores it (docs/openai-api.md)
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking.type == "enabled"}
    if req.metadata and req.metadata.user_id:
        body["user"] = req.metadata.user_id
    if req.stream:  # (the usage from the first chunk on: message_start reports the prompt's tokens)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    fmt = req.output_config.format if req.output_config else None
    if fmt is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "parameters": t.input_schema,
            **({"description": t.description} if t.description else {})}} for t in req.tools]
        c = req.tool_choice
        if c is not None:
            body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(c.type) or \
                {"type": "function", "function": {"name": c.name}}
            if c.disable_parallel_tool_use:
                body["parallel_tool_calls"] = False
    return body


def thinking_scope(scope: dict[str, Any], req: MessagesRequest) -> dict[str, Any]:
    headers = [(k, v) for k, v in scope.get("headers", []) if k != THINKING_HEADER.encode()]
    if req.thinking is not None and req.thinking.type != "adaptive":
        headers.append((THINKING_HEADER.encode(), req.thinking.type.encode()))
    return {**scope, "headers": headers}


def stop_of(finish: str | None, stop_reason: Any, called: bool = False) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): a stop string chat's ``stop_reason`` names (a stop token's
    id, or EOS, is an end of turn). ``called``: the answer has tool_use blocks (chat says "stop",
    not "tool_calls", for a named tool_choice; Anthropic says tool_use all the same)."""
    if called and finish in ("stop", "tool_calls"):
        return "tool_use", None
    if finish == "stop" and isinstance(stop_reason, str) and stop_reason:
        return "stop_sequence", stop_reason
    return _STOP.get(finish or "stop", "end_turn"), None


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def usage(u: dict[str, Any] | None) -> dict[str, Any]:
    u = u or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    # Anthropic's input_tokens are the uncached ones: the prompt is input + cache_read + cache_creation
    return {"input_tokens": u.get("prompt_tokens", 0) - cached, "output_tokens": u.get("completion_tokens", 0),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def from_chat(req: MessagesRequest, body: dict[str, Any]) -> dict[str, Any]:
    choice = (body.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    text = msg.get("content") or ""
    reason, seq = stop_of(choice.get("finish_reason"), choice.get("stop_reason"), bool(msg.get("tool_calls")))
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if thinking := msg.get("reasoning") or msg.get("reasoning_content"):  # (vLLM's new name, or its old)
        content.insert(0, {"type": "thinking", "thinking": thinking, "signature": ""})
    content += [{"type": "tool_use", "id": c.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                 "name": c["function"]["name"], "input": _input(c["function"].get("arguments", ""))}
                for c in msg.get("tool_calls") or []]
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": req.model,
            "content": content, "stop_reason": reason, "stop_sequence": seq, "usage": usage(body.get("usage"))}


def _event(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


async def stream_events(req: MessagesRequest, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Chat chunks in, Anthropic's message stream out: one content block open at a time
    (each is stopped before the next starts, as Anthropic streams them)."""
    chunks = aiter(chunks)
    first = await anext(chunks, None)  # message_start waits for it: its usage counts the prompt
    start = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": req.model,
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": usage(first.get("usage") if first else None)}
    yield _event("message_start", message=start)
    chunks = _after(first, chunks)
    index, open_ = -1, None  # the open block's index and type (None: none open)

    def begin(block: dict[str, Any]) -> list[bytes]:
        """Stop the open block, start ``block``."""
        nonlocal index, open_
        out = [_event("content_block_stop", index=index)] if open_ else []
        index, open_ = index + 1, block["type"]
        return out + [_event("content_block_start", index=index, content_block=block)]

    calls: dict[int, int] = {}  # tool call index -> block index
    finish, stop_reason, last_usage = None, None, None
    async for chunk in chunks:
        if "error" in chunk:
            err = chunk["error"] or {}
            yield _event("error", error={"type": "api_error", "message": err.get("message", "the stream failed")})
            return
        last_usage = chunk.get("usage") or last_usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if thought := delta.get("reasoning") or delta.get("reasoning_content"):  # (one text, two names)
                if open_ != "thinking":
                    for e in begin({"type": "thinking", "thinking": "", "signature": ""}):
                        yield e
                yield _event("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": thought})
            if delta.get("content"):
                if open_ != "text":
                    for e in begin({"type": "text", "text": ""}):
                        yield e
                yield _event("content_block_delta", index=index, delta={"type": "text_delta", "text": delta["content"]})
            for tc in delta.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if tc.get("index", 0) not in calls:
                    for e in begin({"type": "tool_use", "id": tc.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                                    "name": fn.get("name", ""), "input": {}}):
                        yield e
                    calls[tc.get("index", 0)] = index
                if fn.get("arguments"):  # (chat streams one call after another: this is the open block)
                    yield _event("content_block_delta", index=calls[tc.get("index", 0)],
                                 delta={"type": "input_json_delta", "partial_json": fn["arguments"]})
            if choice.get("finish_reason"):
                finish, stop_reason = choice["finish_reason"], choice.get("stop_reason")
    if open_:
        yield _event("content_block_stop", index=index)
    reason, seq = stop_of(finish, stop_reason, bool(calls))
    u = usage(last_usage)
    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": seq},
                 usage={k: u[k] for k in ("output_tokens", "input_tokens", "cache_read_input_tokens",
                                          "cache_creation_input_tokens")})
    yield _event("message_stop")


async def _after(first: dict[str, Any] | None, rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    if first is not None:
        yield first
    async for chunk in rest:
        yield chunk

