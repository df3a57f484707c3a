"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``, one type for
the gateway and the instance server."""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    414: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    499: "invalid_request_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(message: str, type_: str | None = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """Raised anywhere in request handling; answered as OpenAI's error JSON.

    ``type_`` defaults to the one OpenAI uses for ``status``."""

    def __init__(self, status: int, message: str, type_: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        if code is None and status == 400 and param is not None:
            code = "invalid_value"  # a field's value refused (docs/openai-api.md): whichever check found it
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or error_type(status)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class FieldError(ValueError):
    """A check across fields failed inside a request model; ``param`` names the field
    OpenAI's error should point at (a model-level check has no field of its own)."""

    def __init__(self, param: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code  # code: None is invalid_value
