"""A traced request's spans, made where it ran (the engine process), as plain data.

The API process sends a request's W3C ``traceparent`` with it (``Request.trace``, a
string on the msgpack wire); when the request finishes, the engine turns its timings
into four spans under that parent: ``engine.request`` and its phases
``engine.queue`` (arrival to first scheduled), ``engine.prefill`` (to the first
token: prompt chunks, and any recompute after a preemption) and ``engine.decode``
(to the end). They travel back with the final output as lists of strings and
numbers; the API process hands them to its exporter (``llmserve.tracing``), so the
engine process needs no OpenTelemetry, no exporter thread and no network.

A record: ``[name, trace_id, span_id, parent_span_id, start_ns, end_ns, attributes, pid]``
(ids in hex, times in Unix nanoseconds).
"""

from __future__ import annotations

import os
import secrets
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmserve.engine.outputs import RequestMetrics
    from llmserve.engine.request import Request

_ZERO = "0" * 16  # (not a valid span id)


def _span_ids(n: int) -> list[str]:
    """``n`` span ids in hex, from one read of the OS's randomness (not a seeded
    generator: forked processes, instances forked from one template and their engine
    processes, would otherwise draw the same ids)."""
    h = secrets.token_bytes(8 * n).hex()
    return [h[i:i + 16] if h[i:i + 16] != _ZERO else "0000000000000001" for i in range(0, 16 * n, 16)]


def parse_traceparent(value: str) -> tuple[str, str] | None:
    """(trace id, parent span id) of a sampled W3C ``traceparent``, else None."""
    parts = value.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        sampled = int(parts[3], 16) & 1
        int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return (parts[1], parts[2]) if sampled else None


def request_spans(req: Request, finish_reason: str | None, m: RequestMetrics) -> list[list] | None:
    """The finished request's span records, or None if it is not traced."""
    ids = parse_traceparent(req.trace) if req.trace else None
    if ids is None:
        return None
    trace_id, parent = ids
    offset = time.time_ns() - time.monotonic_ns()  # the engine's times are monotonic seconds

    def ns(t: float) -> int:
        return int(t * 1e9) + offset

    end = m.finished_time if m.finished_time is not None else time.monotonic()
    span_ids = _span_ids(4)
    root = span_ids[0]
    pid = os.getpid()
    attrs = {"llmserve.engine_request_id": req.request_id, "gen_ai.usage.input_tokens": req.num_prompt_tokens,
             "gen_ai.usage.output_tokens": req.num_output_tokens,
             "gen_ai.response.finish_reasons": [finish_reason or "abort"],
             "llmserve.cached_tokens": req.num_cached_tokens, "llmserve.preemptions": req.num_preemptions,
             "llmserve.priority": req.priority}
    out = [["engine.request", trace_id, root, parent, ns(m.arrival_time), ns(end), attrs, pid]]
    bounds = [m.arrival_time, m.first_scheduled_time, m.first_token_time, end]
    for i, name in enumerate(("engine.queue", "engine.prefill", "engine.decode")):
        a, b = bounds[i], bounds[i + 1]
        if a is None:
            break
        if b is None:  # ended in this phase (aborted, failed)
            b = end
        out.append([name, trace_id, span_ids[i + 1], root, ns(a), ns(b), {}, pid])
        if b is end:
            break
    return out
