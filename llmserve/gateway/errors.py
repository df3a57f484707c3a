"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """An error answered to the client as-is."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, *, code: str | None = None,
                   param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status,
                        headers=headers)


def from_exception(e: GatewayError) -> JSONResponse:
    return error_response(e.status, e.message, code=e.code, param=e.param, headers=e.headers)


def sse_error_event(message: str, code: str = "upstream_error", status: int = 502) -> bytes:
    """A stream's final event when the upstream fails after streaming began.

    A bare ``data:`` event with an ``error`` key, which the OpenAI SDKs raise as an
    APIError; no ``[DONE]`` follows, so no client mistakes it for a complete answer.
    """
    return b"data: " + json.dumps(error_body(status, message, code)).encode() + b"\n\n"
