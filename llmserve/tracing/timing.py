"""Per-request timings for people and tools: the ``Server-Timing`` header and JSON
access-log lines.

``Server-Timing`` (W3C) is what browsers' network panels and curl users read:
``queue;dur=1.3, prefill;dur=21.0, decode;dur=310.2, attempts;desc="2"`` (milliseconds).
An instance sends its engine's phases on a whole (non-streamed) answer; a stream's
head leaves before they are known, so a stream's phases are in the access log and
the trace. The gateway adds its own entries (``admission``, ``attempts``) before the
instance's.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable

ACCESS_LOGGER = "llmserve.access"


def server_timing(entries: Iterable[tuple[str, float | None, str | None]]) -> str:
    """``(name, milliseconds or None, description or None)`` as one header value."""
    parts = []
    for name, dur, desc in entries:
        p = name
        if dur is not None:
            p += f";dur={dur:.1f}"
        if desc is not None:
            p += f';desc="{desc}"'
        parts.append(p)
    return ", ".join(parts)


def parse_server_timing(value: str) -> dict[str, float | str]:
    """A header value as ``{name: ms}`` (or its description when it has no duration)."""
    out: dict[str, float | str] = {}
    for entry in value.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        if not name:
            continue
        got: float | str = ""
        for p in params:
            k, _, v = p.partition("=")
            if k == "dur":
                try:
                    got = float(v)
                except ValueError:
                    pass
                break
            if k == "desc":
                got = v.strip('"')
        out[name] = got
    return out


def access_logger() -> logging.Logger:
    """The JSON-lines logger: the bare line on stderr, not under the log format's prefix."""
    log = logging.getLogger(ACCESS_LOGGER)
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def access_line(fields: dict) -> str:
    return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))
