"""``/v1/responses`` as a translation onto ``/v1/chat/completions`` (one engine path).

A request becomes a chat body (instructions as the system turn, the stored
conversation of ``previous_response_id`` before the new input, function tools and
``text.format`` mapped onto ``tools`` and ``response_format``), goes through the
host's own chat route (validation, admission, balancing), and its answer comes
back as a response object or as the Responses event stream: ``response.created``,
``response.in_progress``, per output item ``response.output_item.added`` ...
``response.reasoning_text.delta`` / ``response.output_text.delta`` /
``response.function_call_arguments.delta`` ...
``response.output_item.done``, then ``response.completed`` (``response.incomplete``
at the token limit, ``response.failed`` when the chat stream ends in an error).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from llmserve.api.responses_protocol import (FunctionCallItem, FunctionCallOutputItem, MessageItem,
                                             NamedFunctionChoice, ReasoningItem, ResponsesRequest)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _content(parts: str | list[Any]) -> str | list[dict[str, Any]]:
    """Input text parts as chat's text parts: the chat path joins them (by newlines), so
    several parts read as the same parts sent to chat would."""
    if isinstance(parts, str) or not parts:
        return parts or ""
    return [{"type": "text", "text": p.text} for p in parts]


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The new turn's input as chat messages (calls folded into their assistant turn)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    out: list[dict[str, Any]] = []
    reasoning = None  # a reasoning item's text: the next assistant turn's reasoning_content
    for item in req.input:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _content(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and reasoning is None:
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _content(item.output)})
        else:
            assert isinstance(item, ReasoningItem)
            reasoning = (reasoning or "") + _reasoning_text(item)
            continue
        if reasoning is not None and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"] = reasoning
        reasoning = None
    return out


def _reasoning_text(item: ReasoningItem) -> str:
    """A reasoning item's reasoning_text parts (an encrypted or summary-only one has none)."""
    return "".join(p.text or "" for p in item.content or [] if p.type == "reasoning_text")


def chat_body(req: ResponsesRequest, history: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    msgs = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history + new
    body: dict[str, Any] = {"messages": msgs, "stream": req.stream}
    for src, dst in (("model", "model"), ("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("user", "user"), ("priority", "priority"), ("seed", "seed"),
                     ("service_tier", "service_tier")):
        if getattr(req, src) is not None:
            body[dst] = getattr(req, src)
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in req.tools]
        body["parallel_tool_calls"] = req.parallel_tool_calls  # (without tools it would change nothing: a 400)
    choice = req.tool_choice
    if isinstance(choice, NamedFunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None and req.tools:
        body["tool_choice"] = choice
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_schema":
        spec = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.strict is not None:
            spec["strict"] = fmt.strict
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    return body


def message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": new_id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": new_id("rs"), "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    fn = call.get("function") or {}
    return {"type": "function_call", "id": new_id("fc"), "call_id": call.get("id") or new_id("call"),
            "name": fn.get("name", ""), "arguments": fn.get("arguments", ""), "status": status}


def usage(u: dict[str, Any] | None) -> dict[str, Any] | None:
    if not u:
        return None
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    # (cache_write_tokens: OpenAI's SDK requires it; the prefix cache writes at no charge, as the
    # Anthropic route's cache_creation_input_tokens: 0)
    return {"input_tokens": u.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": u.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": (u.get("completion_tokens_details") or {}).get(
                "reasoning_tokens") or 0},
            "total_tokens": u.get("total_tokens", 0)}


class Envelope:
    """The response object's fields that come from the request, shared by both paths."""

    def __init__(self, req: ResponsesRequest, model: str | None) -> None:
        self.req, self.id, self.created_at = req, new_id("resp"), int(time.time())
        self.model = model or req.model or ""

    def build(self, status: str, output: list[dict[str, Any]], usage_: dict[str, Any] | None = None,
              finish: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        incomplete = {"reason": "max_output_tokens"} if finish == "length" else None
        choice = req.tool_choice
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "error": error, "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": self.model, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": req.store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": (req.text.format.model_dump(by_alias=True, exclude_none=True)
                                if req.text and req.text.format else {"type": "text"}), "verbosity": "medium"},
            "tool_choice": choice.model_dump() if isinstance(choice, NamedFunctionChoice) else (choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": "disabled",
            "usage": usage_, "user": req.user, "metadata": req.metadata or {},
            # echoed as OpenAI echoes them (the tier is the one that served it)
            "safety_identifier": req.safety_identifier, "prompt_cache_key": req.prompt_cache_key,
            "service_tier": "default", "background": False, "top_logprobs": 0, "max_tool_calls": None}


def assistant_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The output items as the assistant turn the next request's prompt replays."""
    text = "".join(p["text"] for it in output if it["type"] == "message" for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in output if it["type"] == "function_call"]
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    reasoning = "".join(p["text"] for it in output if it["type"] == "reasoning" for p in it["content"])
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def from_chat(env: Envelope, body: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion body as a response object."""
    choice = (body.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if msg.get("reasoning") or msg.get("reasoning_content"):  # (vLLM's new name, or its old)
        output.append(reasoning_item(msg.get("reasoning") or msg["reasoning_content"]))
    if msg.get("content"):
        output.append(message_item(msg["content"]))
    output += [call_item(c) for c in msg.get("tool_calls") or []]
    if output and choice.get("finish_reason") == "length":
        output[-1]["status"] = "incomplete"  # the item max_output_tokens cut
    env.model = body.get("model") or env.model
    return env.build("completed", output, usage(body.get("usage")), choice.get("finish_reason"))


class EventStream:
    """Chat chunks in, Responses events out; ``response`` is the final object once done."""

    def __init__(self, env: Envelope) -> None:
        self.env = env
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.response: dict[str, Any] | None = None
        self._think: dict[str, Any] | None = None  # the reasoning item being written
        self._text: dict[str, Any] | None = None  # the message item being written
        self._calls: dict[int, dict[str, Any]] = {}  # tool call index -> its item
        self._open_call: dict[str, Any] | None = None  # the function_call item being written

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    def start(self) -> list[bytes]:
        head = self.env.build("in_progress", [])
        return [self.event("response.created", response=head), self.event("response.in_progress", response=head)]

    def _close_text(self, status: str = "completed") -> list[bytes]:
        item, self._text = self._text, None
        return self._close_part(item, status, "response.output_text.done", logprobs=[])

    def _open(self, item: dict[str, Any], part: dict[str, Any]) -> list[bytes]:
        """Add an item with one content part (a message's, a reasoning item's)."""
        self.output.append(item)
        idx = len(self.output) - 1
        return [self.event("response.output_item.added", output_index=idx, item={**item, "content": []}),
                self.event("response.content_part.added", item_id=item["id"], output_index=idx,
                           content_index=0, part=dict(part))]

    def _close_think(self, status: str = "completed") -> list[bytes]:
        item, self._think = self._think, None
        return self._close_part(item, status, "response.reasoning_text.done")

    def _close_part(self, item: dict[str, Any] | None, status: str, done: str, **extra: Any) -> list[bytes]:
        """Finish an item with one content part (``_open``'s): its text's ``done``, the part's, the item's."""
        if item is None:
            return []
        idx, part = self.output.index(item), item["content"][0]
        item["status"] = status
        return [self.event(done, item_id=item["id"], output_index=idx, content_index=0, text=part["text"], **extra),
                self.event("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=idx, item=item)]

    def _close_call(self, status: str = "completed") -> list[bytes]:
        item, self._open_call = self._open_call, None
        if item is None:
            return []
        idx = self.output.index(item)
        item["status"] = status
        return [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                           name=item["name"], arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=idx, item=item)]

    def _close(self, status: str = "completed") -> list[bytes]:
        """Close the open item (at most one is: each is done before the next is added, as OpenAI streams)."""
        return self._close_think(status) + self._close_text(status) + self._close_call(status)

    def chunk(self, chunk: dict[str, Any], finish: list[str | None], usage_: list[Any]) -> list[bytes]:
        out: list[bytes] = []
        if chunk.get("usage"):
            usage_[0] = chunk["usage"]
        self.env.model = chunk.get("model") or self.env.model
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning") or delta.get("reasoning_content")  # (one text, two names)
            if thought:
                if self._think is None:
                    out += self._close()
                    self._think = reasoning_item("", "in_progress")
                    out += self._open(self._think, self._think["content"][0])
                self._think["content"][0]["text"] += thought
                out.append(self.event("response.reasoning_text.delta", item_id=self._think["id"],
                                      output_index=self.output.index(self._think), content_index=0, delta=thought))
            if delta.get("content"):
                if self._text is None:
                    out += self._close()
                    self._text = message_item("", "in_progress")
                    out += self._open(self._text, self._text["content"][0])
                self._text["content"][0]["text"] += delta["content"]
                out.append(self.event("response.output_text.delta", item_id=self._text["id"],
                                      output_index=self.output.index(self._text), content_index=0,
                                      delta=delta["content"], logprobs=[]))
            for tc in delta.get("tool_calls") or []:
                item = self._calls.get(tc.get("index", 0))
                fn = tc.get("function") or {}
                if item is None:
                    out += self._close()
                    item = call_item({"id": tc.get("id"), "function": {"name": fn.get("name", "")}}, "in_progress")
                    self._calls[tc.get("index", 0)] = self._open_call = item
                    self.output.append(item)
                    out.append(self.event("response.output_item.added", output_index=len(self.output) - 1,
                                          item=dict(item)))
                if fn.get("arguments"):
                    item["arguments"] += fn["arguments"]
                    out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                          output_index=self.output.index(item), delta=fn["arguments"]))
            if choice.get("finish_reason"):
                finish[0] = choice["finish_reason"]
        return out

    async def run(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        finish: list[str | None] = [None]
        usage_: list[Any] = [None]
        started = False
        async for chunk in chunks:
            if not started:  # (the first chunk names the model that answers: the head says it too)
                self.env.model = chunk.get("model") or self.env.model
                started = True
                for e in self.start():
                    yield e
            if "error" in chunk:
                for e in self._close("incomplete"):
                    yield e
                err = chunk["error"] or {}
                self.response = None
                failed = self.env.build("failed", self.output, error={"code": err.get("code") or "server_error",
                                                                      "message": err.get("message", "")})
                yield self.event("response.failed", response=failed)
                return
            for e in self.chunk(chunk, finish, usage_):
                yield e
        if not started:
            for e in self.start():
                yield e
        for e in self._close("incomplete" if finish[0] == "length" else "completed"):  # the cut item
            yield e
        self.response = self.env.build("completed", self.output, usage(usage_[0]), finish[0])

    def final_event(self) -> bytes:
        assert self.response is not None
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        return self.event(kind, response=self.response)
