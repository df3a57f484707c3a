"""The request checks the gateway and the instance server share: API keys and the
body-size limit, each decided once here so both answer the same way."""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence

from llmserve.api.errors import APIError


def bearer_token(authorization: bytes | str | None) -> bytes:
    """The credentials of an ``Authorization: Bearer <token>`` header, b"" if there are none.

    The scheme is matched case-insensitively (RFC 9110 §11.1), as OpenAI's servers do."""
    if not authorization:
        return b""
    raw = authorization.encode() if isinstance(authorization, str) else authorization
    return raw[7:].strip() if raw[:7].lower() == b"bearer " else b""


def find_key(token: bytes, keys: Sequence[bytes]) -> int | None:
    """The index of the key ``token`` equals, or None. Every key is compared, each in
    constant time, so the answer's timing says nothing about which key came close."""
    found = None
    for i, key in enumerate(keys):
        if hmac.compare_digest(token, key) and found is None:
            found = i
    return found


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")


def declared_over(headers: Iterable[tuple[bytes, bytes]], limit: int) -> bool:
    """Whether the request's ``content-length`` is over ``limit`` (refused before reading it)."""
    return any(k == b"content-length" and v.isdigit() and int(v) > limit for k, v in headers)
