"""One streamed request against an OpenAI-compatible server, timed chunk by chunk.

The client only observes: it records when each SSE event arrived, what the usage
field said, and, when something went wrong, which kind of failure it was. Every
exception ends in a failed record with a kind; nothing is retried or skipped,
because a hidden failure would make the latency figures look better than the
service is.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmserve.bench.datasets import DEFAULT_PRIORITY, SampleRequest
from llmserve.bench.records import ErrorKind, OutputCountSource, RequestRecord
from llmserve.flags import Flag

Endpoint = Literal["completions", "chat"]
ENDPOINT_PATHS: dict[str, str] = {"completions": "/completions", "chat": "/chat/completions"}


def endpoint_name(text: str) -> str:
    """``chat`` / ``completions``, or the path as ``vllm bench serve --endpoint`` takes it
    (``/v1/chat/completions``); anything else is left for argparse's choices to refuse."""
    path = text.strip().rstrip("/")
    for name, tail in ENDPOINT_PATHS.items():  # (exact spellings: no order needed)
        if path in (name, tail, "/v1" + tail, tail.lstrip("/")):
            return name
    return text


class EndpointConfig(BaseModel):
    """Where and how requests are sent.

    ``base_url`` is the API root (``http://127.0.0.1:8000/v1``); a URL with no path
    gets ``/v1`` appended, so ``http://127.0.0.1:8000`` works too.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field("http://127.0.0.1:8000/v1", description="API root (a URL with no path gets /v1)")
    model: str = Field(description="model name to send (default: the first of GET /v1/models)")
    endpoint: Annotated[Endpoint, Flag(choices=tuple(sorted(ENDPOINT_PATHS)), type=endpoint_name)] = Field(
        "completions", description="or the API path, as vLLM's bench takes it: /v1/completions, /v1/chat/completions")
    api_key: str | None = Field(None, description="sent as 'Authorization: Bearer KEY'")
    ignore_eos: bool = Field(False, description="send ignore_eos so output lengths are exact")
    timeout_s: float = Field(600.0, gt=0.0, description="per-request limit in seconds")
    ready_check_timeout_s: Annotated[float, Flag(name="--ready-check-timeout-sec")] = Field(
        600.0, ge=0.0, description="how long to wait for a server that is not up yet (refused, 502/503/504) "
        "before the run; 0: one try")
    temperature: float = Field(0.0, ge=0.0, description="sent as is (default greedy, like vLLM's bench)")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="sent when given")
    top_k: int | None = Field(None, ge=-1, description="sent when given (vLLM's extra field)")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="sent when given (vLLM's extra field)")
    extra_body: Annotated[dict[str, Any], Flag(skip=True)] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _url(cls, url: str) -> str:
        parts = urlsplit(url)
        try:
            parts.port  # (a port past 65535, or not a number, raises: it would be a traceback at connect)
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base URL must be http(s)://host:port[/path], got {url!r}")
        return url

    @property
    def api_root(self) -> str:
        base = self.base_url.rstrip("/")
        return base + "/v1" if urlsplit(base).path in ("", "/") else base

    @property
    def url(self) -> str:
        return self.api_root + ENDPOINT_PATHS[self.endpoint]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def build_payload(req: SampleRequest, cfg: EndpointConfig) -> dict[str, Any]:
    """The JSON body: streamed, with usage in the last event, greedy like vLLM's bench."""
    body: dict[str, Any] = {
        "model": cfg.model,
        "max_tokens": req.output_len,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.endpoint == "chat":
        body["messages"] = req.messages or [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    for name in ("top_p", "top_k", "min_p"):
        if (value := getattr(cfg, name)) is not None:
            body[name] = value
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if req.priority != DEFAULT_PRIORITY:
        # Only non-default classes carry the field, so servers without priorities
        # see plain OpenAI requests unless --batch-share asks for more.
        body["priority"] = req.priority
    body.update(cfg.extra_body)
    return body


class StreamError(Exception):
    """The server answered 200 but the event stream was not a valid completion stream."""


def _choice_text(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def make_http_client(max_connections: int | None) -> httpx.AsyncClient:
    """One pooled client for the run; ``trust_env=False`` so no proxy is ever used.

    The pool must not queue requests (that wait would be counted as TTFT), so it
    allows as many connections as requests may be in flight.
    """
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(limits=limits, timeout=None, trust_env=False)


async def send_request(
    client: httpx.AsyncClient,
    cfg: EndpointConfig,
    req: SampleRequest,
    index: int,
    clock_origin: float,
    scheduled_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestRecord:
    """Send ``req`` and stream the answer; never raises for request failures.

    ``clock_origin`` is the ``clock()`` value the run's offsets count from; the
    clock is a parameter so tests can replay a stream with known timings.
    """
    rec = RequestRecord(index, req.priority, req.prompt_len, req.output_len, scheduled_s)
    payload = build_payload(req, cfg)
    st = clock()
    rec.start_s = st - clock_origin
    text_parts: list[str] = []
    try:
        async with asyncio.timeout(cfg.timeout_s):
            async with client.stream("POST", cfg.url, json=payload, headers=cfg.headers) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread())[:500].decode("utf-8", "replace")
                    rec.error_kind, rec.http_status = ErrorKind.HTTP_STATUS, resp.status_code
                    rec.error = f"HTTP {resp.status_code}: {body}"
                    return rec
                await _read_stream(resp, rec, st, text_parts, clock)
    except (TimeoutError, httpx.TimeoutException) as e:
        rec.error_kind, rec.error = ErrorKind.TIMEOUT, f"timeout after {cfg.timeout_s:g} s ({type(e).__name__})"
    except (httpx.TransportError, OSError) as e:
        rec.error_kind, rec.error = ErrorKind.CONNECTION, f"{type(e).__name__}: {e}"
    except StreamError as e:
        rec.error_kind, rec.error = ErrorKind.STREAM, str(e)
    else:
        rec.success = True
    rec.generated_text = "".join(text_parts)
    if rec.success:
        if rec.usage_completion_tokens is not None:
            rec.output_tokens, rec.output_source = rec.usage_completion_tokens, OutputCountSource.USAGE
        else:
            rec.output_tokens, rec.output_source = len(rec.chunk_s), OutputCountSource.CHUNKS
    return rec


async def _read_stream(
    resp: httpx.Response, rec: RequestRecord, st: float, text: list[str], clock: Callable[[], float]
) -> None:
    done = False
    async for line in resp.aiter_lines():
        now = clock()
        if not line or line.startswith(":"):
            continue  # event separator or SSE comment (keep-alive)
        if not line.startswith("data:"):
            continue  # event:/id:/retry: fields carry nothing we time
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            raise StreamError(f"malformed event: {data[:200]!r}") from None
        if not isinstance(event, dict):
            raise StreamError(f"malformed event: {data[:200]!r}")
        if "error" in event:
            raise StreamError(f"error event in stream: {json.dumps(event['error'])[:300]}")
        if choices := event.get("choices"):
            rec.chunk_s.append(now - st)
            text.append(_choice_text(choices[0]))
        if usage := event.get("usage"):
            rec.usage_prompt_tokens = usage.get("prompt_tokens")
            rec.usage_completion_tokens = usage.get("completion_tokens")
    if not rec.chunk_s:
        raise StreamError("stream carried no choice: no first token to time")
    if not done:
        raise StreamError("stream ended without 'data: [DONE]'")
