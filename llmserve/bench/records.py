"""What the client observed about one request: raw timings and counts, no derived metrics.

A record keeps the arrival time of every streamed chunk rather than TTFT or ITL
themselves, so that every metric is computed in one place (``metrics.py``) from
the same observations, and a saved result can be re-analysed later with other
definitions without re-running the load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class ErrorKind(str, Enum):
    """Why a request failed. Every failure has exactly one kind; none is dropped."""

    HTTP_STATUS = "http_status"  # the server answered with a non-200 status
    CONNECTION = "connection"  # refused, reset, or dropped mid-stream
    TIMEOUT = "timeout"  # no complete answer within --timeout
    STREAM = "stream"  # 200 but the SSE stream was empty, malformed, cut short or carried an error


class OutputCountSource(str, Enum):
    """Where a request's output-token count came from, from most to least exact."""

    USAGE = "usage"  # the server's final ``usage.completion_tokens``
    TOKENIZER = "tokenizer"  # the bench re-tokenized the generated text
    CHUNKS = "chunks"  # one token per streamed chunk (approximate)


@dataclass(slots=True)
class RequestRecord:
    """One measured request.

    Times are seconds. ``scheduled_s`` and ``start_s`` are offsets from the start of
    the measured run; ``chunk_s`` are offsets from ``start_s`` of each SSE event that
    carried a choice (the events vLLM's bench times), in arrival order.
    """

    index: int
    priority: str
    prompt_len: int
    max_tokens: int
    scheduled_s: float
    start_s: float = 0.0
    chunk_s: list[float] = field(default_factory=list)
    success: bool = False
    error_kind: ErrorKind | None = None
    http_status: int | None = None
    error: str = ""
    output_tokens: int = 0
    output_source: OutputCountSource = OutputCountSource.CHUNKS
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    generated_text: str = ""

    @property
    def failure_label(self) -> str | None:
        """``http_503``, ``connection``, ``timeout``, ``stream``; None when it succeeded."""
        if self.error_kind is None:
            return None
        if self.error_kind is ErrorKind.HTTP_STATUS and self.http_status is not None:
            return f"http_{self.http_status}"
        return self.error_kind.value

    def to_dict(self, include_text: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["error_kind"] = self.error_kind.value if self.error_kind else None
        d["output_source"] = self.output_source.value
        if not include_text:
            d.pop("generated_text")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        d = dict(d)
        d["error_kind"] = ErrorKind(d["error_kind"]) if d.get("error_kind") else None
        d["output_source"] = OutputCountSource(d.get("output_source", "chunks"))
        d.setdefault("generated_text", "")
        return cls(**d)
