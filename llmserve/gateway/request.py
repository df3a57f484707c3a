"""What the gateway reads of a request: its body (capped), the typed request with its
granted priority, and the text that prefix affinity uses.

Validated with the instance's own models (llmserve.api), so a bad request is a 400
at the gateway and never reaches, retries on or trips the breakers of an instance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from fastapi import Request
from starlette.requests import ClientDisconnect

from llmserve.api.limits import body_too_large, declared_over
from llmserve.api.parse import load_json, validate
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest
from llmserve.gateway.auth import Privileges, grant_priority
from llmserve.gateway.errors import GatewayError
from llmserve.priority import PriorityClass, parse_priority


@dataclass(frozen=True)
class ParsedRequest:
    body: dict
    raw: bytes
    model: str
    stream: bool
    user: str | None
    priority: int  # the one granted, not the one claimed
    priority_class: PriorityClass

    @cached_property
    def prompt_chars(self) -> int:
        """What arrival sizes and a key's token estimate count: read once, and only by a
        gateway that has observers or keys (a plain one never pays for it)."""
        return prompt_chars(self.body)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading them all."""
    if declared_over(request.scope["headers"], limit):
        raise body_too_large(limit)
    # Straight from the ASGI receive channel: Starlette's request.stream() wraps the
    # same loop in an async generator, which costs more than the rest of this function.
    receive = request.receive
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_REQUEST_MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}


def parse_request(raw: bytes, headers, client: Privileges, path: str = "/v1/chat/completions") -> ParsedRequest:
    """The request as the gateway will serve it, validated with the instance's own models
    (llmserve.api), so a bad request is a 400 here and never reaches, retries on or trips
    the breakers of an instance; its priority is the granted one."""
    body = load_json(raw)
    if not isinstance(body, dict) or not body.get("model"):  # routing needs it; instances do not
        raise GatewayError(400, "'model' is required", param="model", code="missing_model")
    if "resume_token_ids" in body:  # the gateway's own, for a stream it resumes (gateway/resume.py)
        raise GatewayError(400, "resume_token_ids is not accepted from clients", param="resume_token_ids",
                           code="unsupported_parameter")
    request = validate(body, _REQUEST_MODELS[path])
    user = request.user or headers.get("x-user-id") or None
    claimed = request.priority if request.priority is not None else headers.get("x-priority")
    try:
        priority = grant_priority(parse_priority(claimed), client)
    except ValueError as e:
        raise GatewayError(400, str(e), param="priority", code="invalid_priority") from None
    return ParsedRequest(body, raw, request.model, request.stream, user, priority,
                         PriorityClass.of(priority))


def prompt_text(body: dict, max_chars: int) -> str:
    """The prompt as text, for prefix affinity: chat messages flattened (tools first: the
    instance renders them at the head of the prompt; tool calls as their JSON), or the prompt."""
    if isinstance(body.get("messages"), list):
        parts: list[str] = []
        size = 0
        if body.get("tools") and body.get("tool_choice") != "none":
            parts.append("<tools>" + json.dumps(body["tools"])[:max_chars])
            size = len(parts[0])
        for m in body["messages"]:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):  # content parts
                content = "\n".join(p["text"] for p in content if _text_part(p))  # (as chat joins them)
            if m.get("tool_calls"):
                content = (content or "") + json.dumps(m["tool_calls"])
            piece = f"<{m.get('role', '')}>{content or ''}"
            parts.append(piece)
            size += len(piece)
            if size >= max_chars:
                break
        return "".join(parts)[:max_chars]
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
        if isinstance(prompt, list):  # token ids
            prompt = " ".join(str(t) for t in prompt[:max_chars])
        elif isinstance(prompt, int):  # one prompt given as token ids
            prompt = " ".join(str(t) for t in body["prompt"][:max_chars])
    return prompt[:max_chars] if isinstance(prompt, str) else ""


def _text_part(p: object) -> bool:
    return isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)


def usage_tokens(answer: dict | None) -> tuple[int | None, int]:
    """(prompt, completion) tokens of a whole response's ``usage``; (None, 0) without one."""
    if answer is None:
        return None, 0
    try:
        usage = answer["usage"]
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return None, 0


async def disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def prompt_chars(body: dict) -> int:
    """Characters of prompt text in a request, for arrival-size signals and a key's token
    estimate: the tools' definitions count (the template writes them into the prompt), and
    a token id as the characters a token has (CHARS_PER_TOKEN), not one."""
    from llmserve.autoscale.collector import CHARS_PER_TOKEN

    if isinstance(body.get("messages"), list):
        total = len(json.dumps(body["tools"])) if isinstance(body.get("tools"), list) else 0
        for m in body["messages"]:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                total += len(c)
            elif isinstance(c, list):
                total += sum(len(p.get("text", "")) for p in c if isinstance(p, dict))
        return total
    p = body.get("prompt")
    if isinstance(p, str):
        return len(p)
    if isinstance(p, list):
        per_id = round(CHARS_PER_TOKEN)
        return sum(len(x) if isinstance(x, str) else len(x) * per_id if isinstance(x, list) else per_id for x in p)
    return 0
