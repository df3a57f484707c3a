"""An input file's lines: parsed and checked one by one, so a bad line fails alone.

Pure: bytes in, ``Line`` values out. A line that is not JSON, lacks ``custom_id``,
repeats one, names another endpoint or asks to stream is kept with its error and
written to the error file; the others run. A file with no line to run fails as
OpenAI fails a file that does not validate (``file_errors``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# OpenAI's Batch API also takes /v1/embeddings and /v1/moderations, which llmserve does not serve
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


@dataclass(frozen=True, slots=True)
class Line:
    index: int
    custom_id: str | None
    body: dict[str, Any] | None  # None: the line is bad, ``error`` says why
    error: dict[str, str] | None = None


def _bad(index: int, custom_id: str | None, code: str, message: str) -> Line:
    return Line(index, custom_id, None, {"code": code, "message": f"line {index + 1}: {message}"})


def parse_lines(content: bytes, endpoint: str) -> list[Line]:
    out: list[Line] = []
    seen: set[str] = set()
    for index, raw in enumerate(l for l in content.split(b"\n") if l.strip()):
        try:
            obj = json.loads(raw)
        except ValueError as e:
            out.append(_bad(index, None, "invalid_json", f"not JSON ({e})"))
            continue
        if not isinstance(obj, dict):
            out.append(_bad(index, None, "invalid_request", "a line must be a JSON object"))
            continue
        cid = obj.get("custom_id")
        cid = cid if isinstance(cid, str) and 0 < len(cid) <= 512 else None
        extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
        if cid is None:
            out.append(_bad(index, None, "missing_custom_id", "custom_id must be a string of 1 to 512 characters"))
        elif cid in seen:
            out.append(_bad(index, cid, "duplicate_custom_id", f"custom_id {cid!r} was used by an earlier line"))
        elif extra:
            out.append(_bad(index, cid, "invalid_request", f"unknown field {extra[0]!r}"))
        elif obj.get("method") != "POST":
            out.append(_bad(index, cid, "invalid_method", "method must be POST"))
        elif obj.get("url") != endpoint:
            out.append(_bad(index, cid, "mismatched_url", f"url must be the batch's endpoint {endpoint}"))
        elif not isinstance(obj.get("body"), dict):
            out.append(_bad(index, cid, "invalid_body", "body must be a JSON object"))
        elif obj["body"].get("stream"):
            out.append(_bad(index, cid, "invalid_body", "a batch line cannot stream"))
        else:
            out.append(Line(index, cid, obj["body"]))
        if cid is not None:
            seen.add(cid)
    return out


def batch_model(lines: list[Line]) -> str | None:
    """OpenAI's Batch ``model``: the one model the lines to run name; None when they name
    several, or a line names none."""
    models = {ln.body.get("model") for ln in lines if ln.body is not None}
    only = models.pop() if len(models) == 1 else None
    return only if isinstance(only, str) else None


ERRORS_SHOWN = 100  # errors.data lists this many lines; the error file has every one


def file_errors(lines: list[Line]) -> dict[str, Any] | None:
    """OpenAI's ``errors`` for a batch whose input file has no line to run (the batch is then
    ``failed``: nothing to send); None when one line at least can run."""
    if any(ln.error is None for ln in lines):
        return None
    data = [{"code": ln.error["code"], "message": ln.error["message"], "param": None, "line": ln.index + 1}
            for ln in lines[:ERRORS_SHOWN] if ln.error is not None]
    if len(lines) > ERRORS_SHOWN:  # said, not dropped silently
        data.append({"code": "too_many_errors", "message": f"{len(lines) - ERRORS_SHOWN} more lines failed too: "
                     "the batch's error file has every line", "param": None, "line": None})
    return {"object": "list", "data": data}
