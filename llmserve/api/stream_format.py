"""The wire format of an llmserve stream, in one place: what the instance writes and
the gateway reads back without parsing JSON.

An event is ``data: <json.dumps(chunk)>`` with json's default separators. A
chunk's head is ``{"id": ..., "object": ..., "created": ...`` in that order; with
``return_token_ids`` the first choice carries the new token ids as its *last*
key, so ``, "token_ids": [`` found in the bytes is that key (a ``"`` after
``, `` cannot be inside a JSON string) and its ``]`` ends it. The instance builds
its chunks with :func:`head` and :func:`attach_ids` and writes them with
:func:`sse`; the gateway's resume (``gateway/resume.py``) finds the ids with
:func:`take_ids` and the head with :data:`HEAD`.
"""

from __future__ import annotations

import json
import re
from typing import Any

IDS_FIELD = "token_ids"
IDS_KEY = f', "{IDS_FIELD}": ['.encode()
DONE = b"data: [DONE]"
HEAD = re.compile(rb'data: (\{"id": "[^"\\]*", "object": "[a-z._]*", "created": [0-9]+)')


def head(stream_id: str, obj: str, created: int) -> dict[str, Any]:
    """A chunk's first keys, in the order :data:`HEAD` reads them."""
    return {"id": stream_id, "object": obj, "created": created}


def attach_ids(choice: dict[str, Any], ids: list[int]) -> None:
    """Put ``ids`` on ``choice`` as its last key."""
    choice.pop(IDS_FIELD, None)
    choice[IDS_FIELD] = ids


def sse(obj: dict[str, Any]) -> str:
    """One event (json's default separators: :data:`IDS_KEY` depends on them)."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def take_ids(events: bytes, ids: list[int], strip: bool = True) -> tuple[bytes, int]:
    """Append the token ids in ``events`` to ``ids``; the events without them if ``strip``,
    and how many chunks had them. Found with ``bytes.find``: a regular expression costs
    ~10 us an event, several times the rest."""
    parts, found, at = [], 0, 0
    while (i := events.find(IDS_KEY, at)) >= 0:
        j = events.index(b"]", i)
        inner = events[i + len(IDS_KEY):j]
        if inner:
            ids += map(int, inner.split(b",")) if b"," in inner else (int(inner),)
        parts.append(events[at:i])
        at, found = j + 1, found + 1
    if not strip or not found:
        return events, found
    parts.append(events[at:])
    return b"".join(parts), found
