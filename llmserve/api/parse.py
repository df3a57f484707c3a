"""Request bodies to typed requests, or an OpenAI 400 naming what is wrong.

The same function runs at the gateway and at the instance, so a request either
passes both or fails at the first with the same message. Nothing here raises
anything but ``APIError``: JSON nested past ``Limits.DEPTH``, integers too long
for Python's parser, NaN / Infinity literals, invalid UTF-8 and lone surrogates
(``"\\ud800"``, valid JSON but not text) all become 400s.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from llmserve.api.errors import APIError, FieldError
from llmserve.api.protocol import UNSUPPORTED, Limits

M = TypeVar("M", bound=BaseModel)

# A surrogate can only enter a decoded string through a \uD800-\uDFFF escape.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _HugeInt(str):
    """An integer literal past Python's 4,300-digit parse limit, kept as its digits."""


def _int_or_huge(text: str) -> int | str:
    return int(text) if len(text) <= 4000 else _HugeInt(text)


# A field whose own error code clients may match on (the gateway's privilege rules use it).
_FIELD_CODES = {"priority": "invalid_priority"}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def load_json(raw: bytes, max_depth: int = Limits.DEPTH) -> Any:
    """``raw`` parsed, with depth and text checked; APIError(400) otherwise."""
    try:
        # UTF-8 only (RFC 8259); json.loads would also guess UTF-16 and UTF-32 from bytes.
        obj = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise APIError(400, f"the request body is nested deeper than {max_depth} levels",
                       code="invalid_json") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit, NaN
        if "integer string conversion" in str(e):
            _name_huge_int(json.loads(raw.decode("utf-8"), parse_int=_int_or_huge, parse_constant=_no_constant))
        raise APIError(400, f"the request body is not valid JSON: {_short(e)}", code="invalid_json") from None
    # Cheap byte scans decide whether the walk is needed at all.
    if raw.count(b"[") + raw.count(b"{") > max_depth or _SURROGATE_ESCAPE.search(raw):
        _walk(obj, max_depth)
    return obj


def _name_huge_int(obj: Any) -> None:
    """Raise the 400 for the first over-long integer, naming the field it is in."""
    stack: list[tuple[Any, list]] = [(obj, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _HugeInt):
            param = _path(path) or None
            raise APIError(400, f"{param or 'body'}: an integer of {len(node)} digits is out of range",
                           param=param, code=_FIELD_CODES.get(str(param), "invalid_value"))
        if isinstance(node, dict):
            stack.extend((v, [*path, k]) for k, v in node.items())
        elif isinstance(node, list) and len(path) < Limits.DEPTH:
            stack.extend((v, [*path, i]) for i, v in enumerate(node))


def _walk(obj: Any, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_text(node)
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > max_depth:
            raise APIError(400, f"the request body is nested deeper than {max_depth} levels",
                           code="invalid_json")
        if isinstance(node, dict):
            for k, v in node.items():
                _check_text(k)
                stack.append((v, depth + 1))
        else:
            stack.extend((v, depth + 1) for v in node)


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, "the request holds a lone UTF-16 surrogate (\\ud800-\\udfff): not valid text",
                       code="invalid_text") from None


def parse_model(raw: bytes, model: type[M]) -> M:
    """The body as ``model``: JSON checks, unsupported fields by name, then pydantic."""
    body = load_json(raw)
    return validate(body, model)


def validate(body: Any, model: type[M]) -> M:
    """``body`` as ``model``: a null field is one not given (OpenAI's nullable fields, as vLLM
    reads them), and types are strict: "5" is no integer and true no token id."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    body = {k: v for k, v in body.items() if v is not None}
    for key, why in UNSUPPORTED.items():
        if key in body and key not in model.model_fields:
            raise APIError(400, f"{why} by llmserve ({key!r})", param=key, code="unsupported_parameter")
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as e:
        raise from_validation_error(e) from None


def from_validation_error(e: ValidationError) -> APIError:
    """The first error as OpenAI words it: a message and the field's path as ``param``."""
    def clean(err) -> list:
        # Union members add their type names to the path (str, list[...]): drop them.
        return [x for x in err.get("loc", ()) if x != "body" and (isinstance(x, int) or not _is_type_tag(str(x)))]

    # Of a union's alternatives, the one that got furthest says what is wrong, and of those,
    # a broken bound (17 stop strings, a token id of -1) before another member's type
    err = max(e.errors(include_url=False), key=lambda er: (len(clean(er)), not er["type"].endswith("_type")))
    loc = clean(err)
    param = _path(loc) or None
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        param = _path(loc + [cause.param]) if loc else cause.param
    if err.get("type") == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    code = cause.code if isinstance(cause, FieldError) and cause.code else None
    return APIError(400, f"{param or 'body'}: {msg}", param=param,
                    code=code or _FIELD_CODES.get(str(param), "invalid_value"))


def _is_type_tag(s: str) -> bool:
    # (a model class's name, CamelCase, where the API's own fields are snake_case)
    return s in ("str", "int", "float", "bool") or (s.isidentifier() and s[0].isupper() and "_" not in s) or \
        s.startswith(("list[", "dict[", "constrained-", "literal[", "function-", "type="))


def _path(loc: list) -> str:
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def _short(e: Exception) -> str:
    s = str(e)
    return s if len(s) <= 200 else s[:200] + "..."
