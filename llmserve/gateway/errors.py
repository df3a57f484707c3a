"""The gateway's error responses: llmserve.api's one OpenAI error type, as HTTP and SSE."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

from llmserve.api.errors import APIError, error_body, error_type

# The gateway's name for the shared type (raised with keywords: code=, param=, headers=).
GatewayError = APIError


def error_response(status: int, message: str, *, code: str | None = None,
                   param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, error_type(status), param, code), status_code=status,
                        headers=headers)


def validation_error_response(errors: Sequence[Any]) -> JSONResponse:
    """FastAPI's refusal of an admin body or query as one line naming the field (``instances:
    Input should be ...``), with it as ``param``; not the Python repr of pydantic's list."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return error_response(400, "malformed JSON in the request body", code="invalid_request")
    loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
    msg = first.get("msg", "invalid value")
    if first.get("type") != "missing" and "input" in first:
        given = first["input"]
        given = given.decode("utf-8", "replace") if isinstance(given, bytes) else given  # (a form body)
        msg = f"{msg}, got {json.dumps(given, default=str)[:100]}"
    return error_response(400, f"{'.'.join(loc) or 'body'}: {msg}", code="invalid_request",
                          param=".".join(loc) or None)


def from_exception(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def sse_error_event(message: str, code: str = "upstream_error", status: int = 502) -> bytes:
    """A stream's final event when the upstream fails after streaming began.

    A bare ``data:`` event with an ``error`` key, which the OpenAI SDKs raise as an
    APIError; no ``[DONE]`` follows, so no client mistakes it for a complete answer.
    """
    return b"data: " + json.dumps(error_body(message, error_type(status), None, code)).encode() + b"\n\n"


def json_object(body: bytes) -> dict | None:
    """An upstream's body as the JSON object every OpenAI answer is, or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def upstream_error_body(body: bytes, status: int, instance_id: str) -> bytes:
    """An upstream's error answer in OpenAI's shape: as it is if it has one, else what it
    said (a plain-text or HTML 5xx) inside one."""
    if json_object(body) is not None:
        return body
    text = body[:300].decode("utf-8", "replace")
    return json.dumps(error_body(f"upstream {instance_id} answered {status}: {text}", error_type(status),
                                 None, "upstream_error")).encode()
