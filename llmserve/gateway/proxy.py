"""The request path: parse, route a version, queue for an instance, forward, relay.

Attempts that fail before the first body byte reaches the client (connection
error, 5xx, a stream that breaks before its first event) are retried on another
instance of the same pool, within ``retry.max_attempts`` and the retry budget.
A stream's response head goes out as soon as the first upstream's 200
event-stream head is in (the client's set-up then overlaps the prefill); if that
stream and every retry fail before a first event, the client gets one SSE error
event instead of a status code. Once events flow, a failure is resumed on
another instance from the tokens the client has (``resume``), or else ends the
stream with an SSE error event. Streams are relayed event by event, so that
error event never lands in the middle of a half-written one.

Around it: ``request`` reads and validates the body, ``recorder`` is the one place
the request feeds metrics, canary stats and observers (this module only tells it
what happened), ``resume`` relays a stream's events and resumes it, ``relay`` ends
a stream. The proxy holds only the runtime pieces it uses (:class:`Runtime`).
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
from typing import TYPE_CHECKING, Protocol

import httpx
from fastapi import Request
from fastapi.responses import Response

from llmserve.gateway.adapter_attempt import adapter_gone, adapter_ready
from llmserve.gateway.auth import Privileges
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.errors import GatewayError, json_object, sse_error_event, upstream_error_body
from llmserve.gateway.pool import (Lease, NoHealthyInstance, Outcome, Pool, QueueFull,
                                   QueueTimeout, Waiting)
from llmserve.gateway.recorder import RequestRecord
from llmserve.gateway.relay import RelayResponse, first_bytes, is_sse, one_event, renamed, renaming
from llmserve.gateway.request import disconnected, parse_request, prompt_text, read_body, usage_tokens
from llmserve.gateway.resume import ResumeState, is_engine, open_resume, relay
from llmserve.gateway.upstream import Abandoned, UpstreamResponse, unreachable
from llmserve.gateway.version_router import VERSION_HEADER, RouteReason, UnknownVersion

if TYPE_CHECKING:
    from llmserve.gateway.config import AdapterConfig, GatewayConfig
    from llmserve.gateway.health import RetryBudget
    from llmserve.gateway.runtime import ModelRuntime
    from llmserve.gateway.tenants.limiter import Tenants
    from llmserve.gateway.upstream import UpstreamClient

log = logging.getLogger(__name__)

UPSTREAM_HEADER = "x-llmserve-upstream"
PRIORITY_HEADER = "x-llmserve-priority"  # on the response: the priority the request ran at
# Not x-priority: the gateway sends its own decision (see gateway/auth.py).
_FORWARD_HEADERS = ("accept", "x-request-id", "traceparent", "tracestate", "x-llmserve-thinking")  # (api/messages)
_RETURN_HEADERS = ("content-type", "x-request-id")


class _Plan:
    """One request's attempts: where and what to send, and how the tries went."""

    __slots__ = ("adapter", "attempt", "content", "gone", "headers", "last", "path", "plain", "pool", "request",
                 "resume", "route", "tried")

    def __init__(self, request: Request, pool: Pool, path: str, content: bytes,
                 headers: dict[str, str], route: RouteRequest) -> None:
        self.request, self.pool, self.path = request, pool, path
        self.content, self.headers, self.route = content, headers, route
        self.plain = content  # for an instance that is not an llmserve engine (gateway/resume.py)
        self.resume: ResumeState | None = None
        self.adapter: AdapterConfig | None = None  # a LoRA version's: loaded where it is not yet
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


class Runtime(Protocol):
    """What the request path uses of the gateway (``runtime.Gateway`` is one): the
    models to route to, the retry budget, the upstream client (set when the gateway
    starts) and the config's limits and retry settings. Metrics and observers are
    reached through each model's record sinks (``recorder``), not from here."""

    config: GatewayConfig
    models: dict[str, ModelRuntime]
    retry_budget: RetryBudget
    upstream: UpstreamClient | None
    tenants: Tenants


class Proxy:
    def __init__(self, gateway: Runtime) -> None:
        self.gw = gateway
        # Request ids: a random per-process prefix and a counter (uuid4 per request is a
        # urandom call; ids need to be unique, not secret).
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()

    @property
    def max_resumes(self) -> int:  # (resume.Attempts)
        return self.gw.config.retry.max_resumes

    @property
    def upstream(self) -> UpstreamClient:  # (resume.Attempts)
        return self.gw.upstream

    def _request_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids):016x}"

    async def handle(self, request: Request, path: str, client: Privileges) -> Response:
        t0 = time.monotonic()
        gw = self.gw
        raw = await read_body(request, gw.config.limits.max_body_bytes)
        parsed = parse_request(raw, request.headers, client, path)
        runtime, pinned = gw.resolve(parsed.model)  # (an alias pins its version: configured, not claimed)
        if runtime is None:
            raise GatewayError(404, f"the model {parsed.model!r} does not exist",
                               param="model", code="model_not_found")
        forced = pinned or (request.headers.get(VERSION_HEADER) if client.version_override else None)
        try:
            decision = runtime.router.route(parsed.user, forced)
        except UnknownVersion as e:
            raise GatewayError(400, str(e), code="unknown_version") from None
        version = decision.version
        tab = None if client.key is None else await gw.tenants.admit(  # a 429 here, when over a limit
            client.key, runtime.name, parsed.body, parsed.prompt_chars, parsed.stream, self._request_id(),
            client.budget_only)
        ctx = RequestRecord(runtime.sinks, version, parsed, t0, request.headers.get("x-request-id") or self._request_id(),
                            in_stats=decision.reason is not RouteReason.HEADER or runtime.count_forced,
                            headers=request.headers)
        ctx.tab = tab
        ctx.arrived(decision.reason.value, runtime.router.weights)
        try:
            return await self._attempts(request, path, runtime, ctx)
        except GatewayError as e:
            ctx.finish(e.status, error_kind=e.code, ok=e.status < 500 or e.code in (
                "queue_timeout", "queue_full"))
            e.headers.setdefault(VERSION_HEADER, version)
            raise

    async def _attempts(self, request: Request, path: str, rt: ModelRuntime, ctx: RequestRecord) -> Response:
        gw = self.gw
        upstream_model = rt.upstream_models[ctx.version]
        body, priority = ctx.parsed.body, ctx.parsed.priority
        content = ctx.parsed.raw
        rewrite = {}
        if upstream_model and upstream_model != body.get("model"):  # (the answers' name too: a path on llama.cpp)
            rewrite["model"], ctx.rename = upstream_model, renaming(upstream_model, ctx.parsed.model)
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
        adapter = rt.adapters.get(ctx.version)
        route = RouteRequest(prompt_text(ctx.parsed.body,
                                         prefix_cfg.block_chars * prefix_cfg.max_blocks),
                             ctx.parsed.user, adapter and adapter.name)
        gw.retry_budget.record_request(time.monotonic())
        resume, engine_content = open_resume(body, content, ctx.parsed.stream, self.max_resumes)
        plan = _Plan(request, rt.pool_of[ctx.version], path, engine_content, headers, route)
        plan.plain, plan.resume, plan.adapter = content, resume, adapter
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

    async def _answer(self, plan: _Plan, ctx: RequestRecord) -> Response:
        """Attempts until one answers: a relayed stream, or a whole response."""
        while True:
            got = await self._try_next(plan, ctx)
            if got is None:
                return self._failed(plan, ctx)
            resp, lease = got
            if ctx.parsed.stream and is_sse(resp):
                # The head goes to the client now, before the first event: a client that gets it only
                # with the first token spends its response set-up (~0.7 ms here) inside the TTFT. No
                # body byte is sent until the first event, so a stream that breaks before it is retried.
                current = _Current(resp, lease)
                headers_out = self._headers(resp, ctx)
                headers_out.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
                return RelayResponse(lambda: self._open(plan, ctx, current), current=current,
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
            answer = json_object(body) if resp.status_code == 200 else None  # (read once: its usage below)
            if resp.status_code == 200 and answer is None:  # (a foreign server's HTML, a cut body)
                plan.pool.release(lease, Outcome.FAILURE)
                plan.last = GatewayError(502, f"upstream {lease.instance.instance_id} answered 200 with no JSON "
                                              f"object: {body[:120]!r}", code="upstream_broken")
                continue
            plan.pool.release(lease, Outcome.SUCCESS)
            ctx.prompt_tokens, ctx.output_tokens = usage_tokens(answer)  # (the token counters, a tab, observers)
            ctx.finish(resp.status_code, ok=True)
            return Response(renamed(body, ctx.rename), resp.status_code, headers=self._headers(resp, ctx))

    async def _try_next(self, plan: _Plan, ctx: RequestRecord
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
                ctx.retried()
            try:
                lease = await self.acquire(plan, ctx)
            except GatewayError:
                if plan.last is None:
                    raise
                return None  # no instance for a retry: answer with the last failure
            if plan.attempt > 1:  # the failed one counts against the version (recorder.py says why)
                ctx.attempt_failed(plan.last.code if isinstance(plan.last, GatewayError) else None)
            inst = lease.instance
            if plan.adapter is not None and (failed := await adapter_ready(gw.upstream, plan, lease)) is not None:
                plan.last = failed
                continue
            ctx.sent(inst.instance_id, plan.headers)
            try:
                resp = await gw.upstream.post(f"{inst.url}{plan.path}",
                                              plan.content if is_engine(inst) else plan.plain,
                                              plan.headers, abandon=plan.gone)
            except httpx.HTTPError as e:
                plan.pool.release(lease, Outcome.FAILURE)
                if unreachable(e):  # not ready until its /ready says so (the monitor's next poll
                    plan.pool.set_ready(inst, False)  # would find it so, later): retries wait elsewhere
                plan.last = GatewayError(502, f"upstream {inst.instance_id} failed: "
                                              f"{type(e).__name__}: {e}", code="upstream_unreachable")
                plan.tried.append(inst.instance_id)
                continue
            except BaseException:
                plan.pool.release(lease, Outcome.NEUTRAL)
                raise
            plan.tried.append(inst.instance_id)
            if (gone := await adapter_gone(plan, lease, resp)) is not None:
                plan.last = gone  # evicted since we looked: the retry loads it again
                continue
            if resp.status_code >= 500:
                plan.last, own_fault = await self._read_error(resp, lease, plan.pool)
                if own_fault:  # the request itself failed in the engine: elsewhere too
                    return None
                continue
            return resp, lease
        return None

    def _failed(self, plan: _Plan, ctx: RequestRecord) -> Response:
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

    async def _open(self, plan: _Plan, ctx: RequestRecord, current: _Current) -> AsyncIterator[bytes]:
        """The client's stream: the first upstream that delivers a first event, relayed.
        Until that event nothing but the head has reached the client, so a stream that
        ends or breaks before it is retried like a failed request."""
        while True:
            opened = await first_bytes(current.resp, current.lease, plan.pool)
            if isinstance(opened, str):
                plan.last = GatewayError(502, f"upstream {current.lease.instance.instance_id} closed the "
                                              f"stream before its first event ({opened})",
                                         code="upstream_broken")
                got = await self._try_next(plan, ctx)
                if got is not None and not is_sse(got[0]):
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
                    return one_event(sse_error_event(f"{len(plan.tried)} attempts failed; last: {message}",
                                                     code="upstream_broken"))
                current.resp, current.lease = got
                continue
            return relay(self, plan, ctx, current, *opened)

    async def acquire(self, plan: _Plan, ctx: RequestRecord) -> Lease:
        """An instance of the plan's pool (queue, admission, breakers), not one tried if any other has room."""
        cold = plan.pool.can_grow and plan.pool.cold()
        try:
            waiting = plan.pool.enqueue(plan.route, ctx.parsed.priority_class, exclude=plan.tried)
            lease = waiting.result() if waiting.done else await self._wait_unless_gone(plan, waiting)
        except QueueFull as e:
            raise GatewayError(429, f"{e}; retry after {e.rejected.retry_after_s} s", code="queue_full",
                               headers={"retry-after": str(e.rejected.retry_after_s)}) from None
        except QueueTimeout as e:
            ctx.waited(e.waited_s, cold=False)
            raise GatewayError(503, str(e), code="queue_timeout", headers={"retry-after": "1"}) from None
        except NoHealthyInstance as e:
            raise GatewayError(503, str(e), code=e.code,
                               headers={"retry-after": str(e.retry_after_s)}) from None
        ctx.waited(lease.queued_s, cold)
        return lease

    @staticmethod
    async def _wait_unless_gone(plan: _Plan, waiting: Waiting) -> Lease:
        """Wait in the queue, but leave it if the client disconnects meanwhile, so an
        abandoned request never takes an instance's slot."""
        wait = asyncio.ensure_future(plan.pool.wait(waiting))
        gone = plan.gone or asyncio.ensure_future(disconnected(plan.request))
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
        headers = {h: v for h in _RETURN_HEADERS if (v := resp.headers.get(h))} | {"content-type": "application/json"}
        body = upstream_error_body(body, resp.status_code, lease.instance.instance_id)  # (a JSON object either way)
        return Response(body, resp.status_code, headers=headers), own_fault

    def _headers(self, resp: UpstreamResponse, ctx: RequestRecord) -> dict[str, str]:
        out = {h: resp.headers[h] for h in _RETURN_HEADERS if h in resp.headers}
        out.setdefault("x-request-id", ctx.request_id)
        out[VERSION_HEADER], out[UPSTREAM_HEADER] = ctx.version, ctx.instance or ""
        out.update(ctx.rate_headers)  # (OpenAI's x-ratelimit-*, for a key with windows)
        out[PRIORITY_HEADER] = str(ctx.parsed.priority)
        out["server-timing"] = ctx.server_timing(resp.headers.get("server-timing"))
        return out
