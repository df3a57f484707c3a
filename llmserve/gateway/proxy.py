"""The request path: parse, route a version, queue for an instance, forward, relay.

Attempts that fail before the first body byte reaches the client (connection
error, 5xx, a stream that breaks before its first event) are retried on another
instance of the same pool, within ``retry.max_attempts`` and the retry budget.
A stream's response head goes out as soon as the first upstream's 200
event-stream head is in (the client's set-up then overlaps the prefill); if that
stream and every retry fail before a first event, the client gets one SSE error
event instead of a status code. Once events flow, a failure ends the stream with
an SSE error event. Streams are relayed event by event, so that error event never
lands in the middle of a half-written one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from llmserve.api.parse import load_json, validate
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest
from llmserve.gateway.auth import Privileges, grant_priority
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.errors import GatewayError, sse_error_event
from llmserve.gateway.pool import (Lease, NoHealthyInstance, Outcome, Pool, QueueFull,
                                   QueueTimeout, Waiting)
from llmserve.gateway.upstream import Abandoned, UpstreamResponse
from llmserve.gateway.version_router import VERSION_HEADER, RouteReason, UnknownVersion
from llmserve.priority import PriorityClass, parse_priority

if TYPE_CHECKING:
    from llmserve.gateway.app import Gateway, ModelRuntime

log = logging.getLogger(__name__)

UPSTREAM_HEADER = "x-llmserve-upstream"
PRIORITY_HEADER = "x-llmserve-priority"  # on the response: the priority the request ran at
# Not x-priority: the gateway sends its own decision (see gateway/auth.py).
_FORWARD_HEADERS = ("accept", "x-request-id", "traceparent", "tracestate")
_RETURN_HEADERS = ("content-type", "x-request-id")


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    body: dict
    raw: bytes
    model: str
    stream: bool
    user: str | None
    priority: int  # the one granted, not the one claimed
    priority_class: PriorityClass


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"the request body is over the limit of {limit} bytes",
                           code="body_too_large")
    # Straight from the ASGI receive channel: Starlette's request.stream() wraps the
    # same loop in an async generator, which costs more than the rest of this function.
    receive = request.receive
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, f"the request body is over the limit of {limit} bytes",
                               code="body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_REQUEST_MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}


def parse_request(raw: bytes, headers, client: Privileges, path: str = "/v1/chat/completions") -> ParsedRequest:
    """The request as the gateway will serve it, validated with the instance's own models
    (llmserve.api), so a bad request is a 400 here and never reaches, retries on or trips
    the breakers of an instance; its priority is the granted one."""
    body = load_json(raw)
    if not isinstance(body, dict) or not body.get("model"):  # routing needs it; instances do not
        raise GatewayError(400, "'model' is required", param="model", code="missing_model")
    request = validate(body, _REQUEST_MODELS[path])
    user = request.user or headers.get("x-user-id") or None
    claimed = request.priority if request.priority is not None else headers.get("x-priority")
    try:
        priority = grant_priority(parse_priority(claimed), client)
    except ValueError as e:
        raise GatewayError(400, str(e), param="priority", code="invalid_priority") from None
    return ParsedRequest(body, raw, request.model, request.stream, user, priority,
                         PriorityClass.of(priority))


def prompt_text(body: dict, max_chars: int) -> str:
    """The prompt as text, for prefix affinity: chat messages flattened (tools first: the
    instance renders them at the head of the prompt; tool calls as their JSON), or the prompt."""
    if isinstance(body.get("messages"), list):
        parts: list[str] = []
        size = 0
        if body.get("tools") and body.get("tool_choice") != "none":
            parts.append("<tools>" + json.dumps(body["tools"])[:max_chars])
            size = len(parts[0])
        for m in body["messages"]:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):  # content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if m.get("tool_calls"):
                content = (content or "") + json.dumps(m["tool_calls"])
            piece = f"<{m.get('role', '')}>{content or ''}"
            parts.append(piece)
            size += len(piece)
            if size >= max_chars:
                break
        return "".join(parts)[:max_chars]
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
        if isinstance(prompt, list):  # token ids
            prompt = " ".join(str(t) for t in prompt[:max_chars])
        elif isinstance(prompt, int):  # one prompt given as token ids
            prompt = " ".join(str(t) for t in body["prompt"][:max_chars])
    return prompt[:max_chars] if isinstance(prompt, str) else ""


def _completion_tokens(body: bytes) -> int:
    try:
        return int(json.loads(body)["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return 0


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def prompt_chars(body: dict) -> int:
    """Characters of prompt text in a request, for arrival-size signals."""
    if isinstance(body.get("messages"), list):
        total = 0
        for m in body["messages"]:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                total += len(c)
            elif isinstance(c, list):
                total += sum(len(p.get("text", "")) for p in c if isinstance(p, dict))
        return total
    p = body.get("prompt")
    if isinstance(p, str):
        return len(p)
    if isinstance(p, list):
        return sum(len(x) if isinstance(x, str | list) else 1 for x in p)
    return 0


def _last_event_end(buf: bytes) -> int:
    """Index just past the last complete SSE event in ``buf`` (0 if none)."""
    a, b = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
    return max(a + 2 if a >= 0 else 0, b + 4 if b >= 0 else 0)


def _is_sse(resp: UpstreamResponse) -> bool:
    return resp.headers.get("content-type", "").startswith("text/event-stream")


class _Plan:
    """One request's attempts: where and what to send, and how the tries went."""

    __slots__ = ("attempt", "content", "gone", "headers", "last", "path", "pool", "request", "route",
                 "tried")

    def __init__(self, request: Request, pool: Pool, path: str, content: bytes,
                 headers: dict[str, str], route: RouteRequest) -> None:
        self.request, self.pool, self.path = request, pool, path
        self.content, self.headers, self.route = content, headers, route
        self.attempt = 0
        self.tried: list[str] = []
        self.last: GatewayError | Response | None = None
        # Non-streaming: done when the client leaves (the body is read, so the next ASGI
        # message is the disconnect); the queue wait and the upstream response give up then.
        self.gone: asyncio.Future | None = None


class _Current:
    """The upstream a stream relays now (a retry before the first event replaces it)."""

    __slots__ = ("lease", "resp")

    def __init__(self, resp: UpstreamResponse, lease: Lease) -> None:
        self.resp, self.lease = resp, lease


class Proxy:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        # Request ids: a random per-process prefix and a counter (uuid4 per request is a
        # urandom call; ids need to be unique, not secret).
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()

    def _request_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids):016x}"

    async def handle(self, request: Request, path: str, client: Privileges) -> Response:
        t0 = time.monotonic()
        gw = self.gw
        raw = await read_body(request, gw.config.limits.max_body_bytes)
        parsed = parse_request(raw, request.headers, client, path)
        runtime = gw.models.get(parsed.model)
        if runtime is None:
            raise GatewayError(404, f"the model {parsed.model!r} does not exist",
                               param="model", code="model_not_found")
        forced = request.headers.get(VERSION_HEADER) if client.version_override else None
        try:
            decision = runtime.router.route(parsed.user, forced)
        except UnknownVersion as e:
            raise GatewayError(400, str(e), code="unknown_version") from None
        version = decision.version
        gw.metrics.child(gw.metrics.routed, parsed.model, version, decision.reason.value).inc()
        ctx = _Context(runtime, version, parsed, t0, request.headers.get("x-request-id") or self._request_id(),
                       in_stats=decision.reason is not RouteReason.HEADER or runtime.count_forced)
        if gw.observers:
            chars = prompt_chars(parsed.body)
            for o in gw.observers:
                o.on_arrival(parsed.model, version, t0, chars)
        try:
            return await self._attempts(request, path, ctx)
        except GatewayError as e:
            ctx.finish(e.status, error_kind=e.code, ok=e.status < 500 or e.code in (
                "queue_timeout", "queue_full"))
            e.headers.setdefault(VERSION_HEADER, version)
            raise

    async def _attempts(self, request: Request, path: str, ctx: _Context) -> Response:
        gw, rt = self.gw, ctx.runtime
        upstream_model = rt.upstream_models[ctx.version]
        body, priority = ctx.parsed.body, ctx.parsed.priority
        content = ctx.parsed.raw
        rewrite = {}
        if upstream_model:
            rewrite["model"] = upstream_model
        if "priority" in body and body["priority"] != priority:
            rewrite["priority"] = priority
        if rewrite:
            content = json.dumps({**body, **rewrite}).encode()
        headers = {"content-type": "application/json", "accept-encoding": "identity",
                   "x-request-id": ctx.request_id, VERSION_HEADER: ctx.version,
                   "x-priority": str(priority)}
        headers.update({h: request.headers[h] for h in _FORWARD_HEADERS
                        if h in request.headers and h != "x-request-id"})
        upstream_auth = rt.upstream_auth[ctx.version]
        if upstream_auth:
            headers["authorization"] = upstream_auth
        prefix_cfg = rt.config.balancer.prefix
        route = RouteRequest(prompt_text(ctx.parsed.body,
                                         prefix_cfg.block_chars * prefix_cfg.max_blocks),
                             ctx.parsed.user)
        gw.retry_budget.record_request(time.monotonic())
        plan = _Plan(request, rt.pools[ctx.version], path, content, headers, route)
        if not ctx.parsed.stream:
            plan.gone = asyncio.ensure_future(request.receive())
        try:
            return await self._answer(plan, ctx)
        except Abandoned:
            raise GatewayError(499, "the client closed the request before its answer",
                               code="client_disconnected") from None
        finally:
            if plan.gone is not None:
                plan.gone.cancel()

    async def _answer(self, plan: _Plan, ctx: _Context) -> Response:
        """Attempts until one answers: a relayed stream, or a whole response."""
        gw = self.gw
        while True:
            got = await self._try_next(plan, ctx)
            if got is None:
                return self._failed(plan, ctx)
            resp, lease = got
            if ctx.parsed.stream and _is_sse(resp):
                # The head goes to the client now, before the first event: a client
                # that gets it only with the first token spends its response set-up
                # (~0.7 ms here) inside the TTFT. No body byte is sent until the first
                # event, so a stream that breaks before it is still retried.
                current = _Current(resp, lease)
                headers_out = self._headers(resp, ctx)
                headers_out.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
                return _RelayResponse(self._stream(plan, ctx, current), current=current,
                                      pool=plan.pool, ctx=ctx, status_code=resp.status_code,
                                      headers=headers_out)
            try:
                body = await resp.aread()
            except httpx.HTTPError as e:
                plan.pool.release(lease, Outcome.FAILURE)
                plan.last = GatewayError(502, f"upstream {lease.instance.instance_id} broke off: {e}",
                                         code="upstream_broken")
                continue
            except Abandoned:
                plan.pool.release(lease, Outcome.NEUTRAL)
                raise
            finally:
                resp.close()  # before the answer is whole, this closes the connection: the engine stops
            plan.pool.release(lease, Outcome.SUCCESS)
            if gw.observers and resp.status_code == 200:
                ctx.output_tokens = _completion_tokens(body)
            ctx.finish(resp.status_code, ok=True)
            return Response(body, resp.status_code, headers=self._headers(resp, ctx))

    async def _try_next(self, plan: _Plan, ctx: _Context
                        ) -> tuple[UpstreamResponse, Lease] | None:
        """Send the next attempt and return its upstream response (head in, status
        below 500) with its lease, or None when no attempt is left (the reason is in
        ``plan.last``). Failed tries release their lease and are recorded there."""
        gw = self.gw
        while plan.attempt < gw.config.retry.max_attempts:
            plan.attempt += 1
            if plan.attempt > 1:
                if not gw.retry_budget.try_acquire(time.monotonic()):
                    log.info("retry budget exhausted; not retrying %s", ctx.request_id)
                    return None
                gw.metrics.child(gw.metrics.retries, ctx.runtime.config.name, ctx.version).inc()
            try:
                lease = await self._acquire(plan, ctx)
            except GatewayError:
                if plan.last is None:
                    raise
                return None  # no instance for a retry: answer with the last failure
            inst = lease.instance
            ctx.instance = inst.instance_id
            gw.metrics.child(gw.metrics.upstream, ctx.runtime.config.name, ctx.version,
                             inst.instance_id).inc()
            try:
                resp = await gw.upstream.post(f"{inst.url}{plan.path}", plan.content, plan.headers,
                                              abandon=plan.gone)
            except httpx.HTTPError as e:
                plan.pool.release(lease, Outcome.FAILURE)
                plan.last = GatewayError(502, f"upstream {inst.instance_id} failed: "
                                              f"{type(e).__name__}: {e}", code="upstream_unreachable")
                plan.tried.append(inst.instance_id)
                continue
            except BaseException:
                plan.pool.release(lease, Outcome.NEUTRAL)
                raise
            plan.tried.append(inst.instance_id)
            if resp.status_code >= 500:
                plan.last, own_fault = await self._read_error(resp, lease, plan.pool)
                if own_fault:  # the request itself failed in the engine: elsewhere too
                    return None
                continue
            return resp, lease
        return None

    def _failed(self, plan: _Plan, ctx: _Context) -> Response:
        """The answer when every attempt failed before the response began."""
        last = plan.last
        if isinstance(last, Response):
            ctx.finish(last.status_code, ok=False, error_kind="upstream_5xx")
            last.headers[VERSION_HEADER] = ctx.version
            last.headers[UPSTREAM_HEADER] = ctx.instance or ""
            return last
        assert last is not None
        if len(plan.tried) > 1:
            last.message = f"{len(plan.tried)} attempts failed; last: {last.message}"
        raise last

    async def _stream(self, plan: _Plan, ctx: _Context, current: _Current) -> AsyncIterator[bytes]:
        """The client's stream: the first upstream that delivers a first event, relayed.
        Until that event nothing but the head has reached the client, so a stream that
        ends or breaks before it is retried like a failed request."""
        while True:
            resp, lease = current.resp, current.lease
            chunks = resp.aiter_raw()
            try:
                first = await anext(chunks)
            except (httpx.HTTPError, StopAsyncIteration) as e:
                resp.close()
                plan.pool.release(lease, Outcome.FAILURE)
                plan.last = GatewayError(502, f"upstream {lease.instance.instance_id} closed the "
                                              f"stream before its first event ({type(e).__name__})",
                                         code="upstream_broken")
                got = await self._try_next(plan, ctx)
                if got is not None and not _is_sse(got[0]):
                    # A retry answered 4xx or JSON: too late for its status code.
                    bad, bad_lease = got
                    plan.last = GatewayError(502, f"upstream {bad_lease.instance.instance_id} "
                                                  f"answered {bad.status_code} to a retried stream",
                                             code="upstream_broken")
                    bad.close()
                    plan.pool.release(bad_lease, Outcome.NEUTRAL)
                    got = None
                if got is None:
                    last = plan.last
                    message = last.message if isinstance(last, GatewayError) else \
                        f"upstream answered {last.status_code}"
                    ctx.finish(502, ok=False, error_kind="upstream_broken")
                    yield sse_error_event(f"{len(plan.tried)} attempts failed; last: {message}",
                                          code="upstream_broken")
                    return
                current.resp, current.lease = got
                continue
            async for out in self._relay(first, chunks, resp, lease, plan.pool, ctx):
                yield out
            return

    async def _acquire(self, plan: _Plan, ctx: _Context) -> Lease:
        cold = plan.pool.can_grow and plan.pool.cold()
        try:
            waiting = plan.pool.enqueue(plan.route, ctx.parsed.priority_class, exclude=plan.tried)
            lease = waiting.result() if waiting.done else await self._wait_unless_gone(plan, waiting)
        except QueueFull as e:
            raise GatewayError(429, f"{e}; retry after {e.rejected.retry_after_s} s",
                               code="queue_full",
                               headers={"retry-after": str(e.rejected.retry_after_s)}) from None
        except QueueTimeout as e:
            ctx.queued_s += e.waited_s
            raise GatewayError(503, str(e), code="queue_timeout") from None
        except NoHealthyInstance as e:
            raise GatewayError(503, str(e), code="no_healthy_instance") from None
        ctx.queued_s += lease.queued_s
        if cold:
            self.gw.metrics.child(self.gw.metrics.cold_wait, ctx.runtime.config.name, ctx.version).observe(
                lease.queued_s)
        return lease

    @staticmethod
    async def _wait_unless_gone(plan: _Plan, waiting: Waiting) -> Lease:
        """Wait in the queue, but leave it if the client disconnects meanwhile, so an
        abandoned request never takes an instance's slot."""
        wait = asyncio.ensure_future(plan.pool.wait(waiting))
        gone = plan.gone or asyncio.ensure_future(_disconnected(plan.request))
        try:
            await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if gone is not plan.gone:
                gone.cancel()
            if not wait.done():
                wait.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await wait
        if wait.cancelled():
            raise GatewayError(499, "the client closed the request while it was queued",
                               code="client_disconnected")
        return wait.result()

    async def _read_error(self, resp: UpstreamResponse, lease: Lease, pool: Pool) -> tuple[Response, bool]:
        """A 5xx from upstream, kept to pass through if no retry succeeds, and whether it
        is the request's own failure (an instance's ``request_failed``: the engine failed
        that request alone and served the others). That one is neither retried, since
        it would fail on every instance, nor held against the instance's health."""
        try:
            body = await resp.aread()
        except httpx.HTTPError:
            body = b""
        except Abandoned:  # the client left; the instance answered 5xx all the same
            pool.release(lease, Outcome.FAILURE)
            raise
        finally:
            await resp.aclose()
        own_fault = resp.status_code == 500 and b'"request_failed"' in body[:4096]
        pool.release(lease, Outcome.NEUTRAL if own_fault else Outcome.FAILURE)
        headers = {h: resp.headers[h] for h in _RETURN_HEADERS if h in resp.headers}
        return Response(body, resp.status_code, headers=headers), own_fault

    def _headers(self, resp: UpstreamResponse, ctx: _Context) -> dict[str, str]:
        out = {h: resp.headers[h] for h in _RETURN_HEADERS if h in resp.headers}
        out.setdefault("x-request-id", ctx.request_id)
        out[VERSION_HEADER] = ctx.version
        out[UPSTREAM_HEADER] = ctx.instance or ""
        out[PRIORITY_HEADER] = str(ctx.parsed.priority)
        return out

    async def _relay(self, first: bytes, chunks: AsyncIterator[bytes], resp: UpstreamResponse,
                     lease: Lease, pool: Pool, ctx: _Context) -> AsyncIterator[bytes]:
        outcome, status, kind = Outcome.NEUTRAL, resp.status_code, None
        buf = first
        try:
            while True:
                end = _last_event_end(buf)
                if end:
                    out, buf = buf[:end], buf[end:]
                    if ctx.ttft_s is None:
                        ctx.ttft_s = time.monotonic() - ctx.t0
                        for o in self.gw.observers:
                            o.on_first_token(ctx.runtime.config.name, ctx.version,
                                             ctx.t0 + ctx.ttft_s, ctx.ttft_s)
                    done = out.count(b"data: [DONE]")
                    ctx.output_tokens += out.count(b"data: ") - done
                    if done:
                        # The client has the whole answer: a close from here on is no 499.
                        outcome = Outcome.SUCCESS
                    yield out
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                buf += chunk
            if buf:
                yield buf
            outcome = Outcome.SUCCESS
        except httpx.HTTPError as e:
            outcome, status, kind = Outcome.FAILURE, 502, "stream_broken"
            log.warning("upstream %s broke mid-stream (%s): %s", lease.instance.instance_id,
                        ctx.request_id, e)
            yield sse_error_event(
                f"the upstream instance failed mid-stream ({type(e).__name__}); "
                "the response is incomplete", code="upstream_broken")
        finally:
            _end_stream(resp, lease, pool, ctx, outcome, status, kind)


def _end_stream(resp: UpstreamResponse, lease: Lease, pool: Pool, ctx: _Context,
                      outcome: Outcome, status: int, kind: str | None) -> None:
    """Free the slot, close the upstream, record the outcome; once per stream."""
    if lease.released:
        return
    pool.release(lease, outcome)
    resp.close()  # synchronous, so a cancellation cannot cut it short
    if outcome is Outcome.NEUTRAL:
        ctx.finish(499, error_kind="client_disconnected", ok=True)
    else:
        ctx.finish(status, error_kind=kind, ok=outcome is Outcome.SUCCESS)


class _RelayResponse(StreamingResponse):
    """A streaming response that frees its upstream slot even when the client is gone
    before the body starts: then the relay generator never runs, so its own
    ``finally`` never does either.

    Like Starlette's, it streams while listening for the client's disconnect and
    cancels the stream when the client leaves (the relay then closes the upstream,
    so the engine stops generating), but with two plain asyncio tasks: Starlette's
    anyio task group cost about as much CPU per request as the whole relay (its
    cancel even formats task reprs)."""

    def __init__(self, body, *, current: _Current, pool: Pool, ctx: _Context, **kw) -> None:
        super().__init__(body, **kw)
        self._cleanup = (current, pool, ctx)

    async def __call__(self, scope, receive, send) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))
        gone = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait((stream, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            stream.cancel()  # a no-op once it is done
            try:
                await asyncio.wait((stream,))  # let the relay's own cleanup finish
            finally:
                current, pool, ctx = self._cleanup
                _end_stream(current.resp, current.lease, pool, ctx, Outcome.NEUTRAL, 499, None)
                # Gone while a retry was being sent: the lease above was already released.
                ctx.finish(499, error_kind="client_disconnected", ok=True)  # once-only
            error = stream.exception() if stream.done() and not stream.cancelled() else None
        if error is not None:
            raise error


class _Context:
    """Per-request bookkeeping for metrics and canary stats."""

    __slots__ = ("done", "in_stats", "instance", "output_tokens", "parsed", "queued_s",
                 "request_id", "runtime", "t0", "ttft_s", "version")

    def __init__(self, runtime: ModelRuntime, version: str, parsed: ParsedRequest, t0: float,
                 request_id: str, *, in_stats: bool = True) -> None:
        self.runtime, self.version, self.parsed, self.t0 = runtime, version, parsed, t0
        self.request_id = request_id
        self.in_stats = in_stats  # counts in the canary analysis's window stats
        self.instance: str | None = None
        self.ttft_s: float | None = None
        self.queued_s = 0.0
        self.output_tokens = 0
        self.done = False

    def finish(self, status: int, *, ok: bool, error_kind: str | None = None) -> None:
        """Record the request's outcome once; ``ok`` is False only for upstream faults."""
        if self.done:
            return
        self.done = True
        rt, m = self.runtime, self.runtime.gateway.metrics
        labels = (rt.config.name, self.version, self.parsed.priority_class.name.lower())
        e2e = time.monotonic() - self.t0
        m.child(m.requests, *labels, str(status)).inc()
        if error_kind is not None or status >= 400:
            m.child(m.errors, *labels, error_kind or f"http_{status}").inc()
        if self.instance is not None:
            m.child(m.queue_time, *labels).observe(self.queued_s)
        if self.ttft_s is not None:
            m.child(m.ttft, *labels).observe(self.ttft_s)
        if ok and status < 400:
            m.child(m.e2e, *labels).observe(e2e)
        if self.in_stats and (self.instance is not None or not ok) and status != 499:
            rt.stats.record(self.version, time.time(), ok, self.ttft_s,
                            e2e if ok and status < 400 else None)
        for o in rt.gateway.observers:
            o.on_finish(rt.config.name, self.version, self.t0 + e2e, e2e, self.output_tokens,
                        ok and status < 400)
