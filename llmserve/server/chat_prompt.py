"""A chat request's prompt ids: through the model's template, with tools rendered by the
template when it reads them, else in ``tool_calls.py``'s notation inside a system message."""

from __future__ import annotations

from typing import Any

from llmserve.api.errors import APIError
from llmserve.server.tool_calls import render_messages


def encode_chat(tokenizer: Any, msgs: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None, kwargs: dict[str, Any],
                continue_final_message: bool = False, notation: str = "hermes") -> list[int]:
    """``notation``: the tool-call parser that reads the answer (how our tools text asks for calls)."""
    kwargs = {**kwargs, "continue_final_message": continue_final_message} if continue_final_message else kwargs
    msgs = _ipython(tokenizer, msgs, bool(tools))
    try:
        if tokenizer.template_reads("tools", tools=bool(tools)):  # it renders tools, calls and results itself
            extra = {"tools": tools} if tools else {}
            return tokenizer.encode_chat(msgs, add_generation_prompt=add_generation_prompt, **kwargs, **extra)
        if not (tools or any(m["role"] == "tool" or "tool_calls" in m for m in msgs)):
            return tokenizer.encode_chat(msgs, add_generation_prompt=add_generation_prompt, **kwargs)
        rendered = render_messages(msgs, tools, notation)
        try:
            return tokenizer.encode_chat(rendered, add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception:  # noqa: BLE001 - retried below, or re-raised as the caller's 400
            if not _added_system(msgs, rendered):
                raise
            # A template with no system role (Gemma 2's raises on one): the tools text we added
            # goes ahead of the first user turn instead, where such templates put a system prompt.
            folded = _fold_system(rendered)
            if folded is None:
                raise
            return tokenizer.encode_chat(folded, add_generation_prompt=add_generation_prompt, **kwargs)
    except Exception as e:  # noqa: BLE001 - template errors (raise_exception too) are the caller's input
        raise APIError(400, f"cannot apply the chat template: {e}", param="messages") from None


def _ipython(tokenizer: Any, msgs: list[dict[str, Any]], tools: bool) -> list[dict[str, Any]]:
    """Llama 3.x's ``ipython`` results go to a template that names the role as they are, to
    any other as ``tool`` results (which it renders, or ``render_messages`` does)."""
    if not any(m["role"] == "ipython" for m in msgs):
        return msgs
    source = (tools and getattr(tokenizer, "tool_chat_template", None)) or getattr(tokenizer, "chat_template", "")
    if "ipython" in (source or ""):
        return msgs
    return [{**m, "role": "tool"} if m["role"] == "ipython" else m for m in msgs]


def _added_system(original: list[dict[str, Any]], rendered: list[dict[str, Any]]) -> bool:
    """The rendered conversation opens with a system message the caller did not send."""
    return bool(rendered) and rendered[0]["role"] == "system" and not (original and original[0]["role"] == "system")


def _fold_system(rendered: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    system, rest = rendered[0]["content"], rendered[1:]
    for i, m in enumerate(rest):
        if m["role"] == "user":
            return rest[:i] + [{**m, "content": f"{system}\n\n{m['content'] or ''}"}] + rest[i + 1:]
    return None
