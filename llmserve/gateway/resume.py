"""Mid-stream resume: a stream whose upstream breaks after its first event goes on,
on another instance of the same version, from the tokens the client already has.

llmserve instances are asked for each chunk's token ids (``return_token_ids``;
stripped again unless the client asked for them itself), and the gateway keeps
those of the events the client was sent. When the upstream breaks (the
connection resets or closes before ``[DONE]``, or it reports its engine dead) the
original body goes to another instance through the pool as usual (admission,
breakers, the balancer; the instances tried are excluded) with
``resume_token_ids``: that engine counts them as output already generated
(``max_tokens`` still means the whole answer, as do stop strings, penalties and
usage; engine/resume.py), and its text goes on exactly where the client's
stopped. Its events get the client stream's ``id`` and ``created``; it sends no
second role chunk or echo. Greedy and seeded streams come out as if unbroken.

A stream is not resumed (it ends with an error event that says why) when it has
several choices or prompts, is parsed for tool calls, came from an instance that
is not an llmserve engine (one read through ``/metrics``: no token-id
continuation), or has used its ``retry.max_resumes``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import httpx

from llmserve.api.stream_format import DONE, HEAD, IDS_KEY, take_ids
from llmserve.gateway.adapter_attempt import adapter_ready
from llmserve.gateway.errors import GatewayError, sse_error_event
from llmserve.gateway.pool import Lease, Outcome, Pool, Upstream
from llmserve.gateway.recorder import RequestRecord
from llmserve.gateway.relay import Current, end_stream, first_bytes, is_sse, last_event_end, renamed
from llmserve.gateway.tenants.tab import first_events
from llmserve.gateway.upstream import unreachable

if TYPE_CHECKING:
    from llmserve.gateway.config import AdapterConfig
    from llmserve.gateway.upstream import UpstreamClient

log = logging.getLogger(__name__)

# The stream's wire format (chunk head, the ids' key) is api/stream_format.py's, which
# the instance writes with.
_IDS_LEN = len(IDS_KEY)
_DEAD = b'"code": "engine_dead"'  # the instance's engine died: an instance failure


class Plan(Protocol):
    """What resuming reads of a request's attempts (proxy's plan)."""

    pool: Pool
    path: str
    content: bytes  # the body as llmserve instances get it
    headers: dict[str, str]
    tried: list[str]  # instance ids, excluded from the next pick
    resume: ResumeState | None
    adapter: AdapterConfig | None  # a LoRA version's adapter: loaded where it is not yet


class Attempts(Protocol):
    """The attempt loop a resume goes through (the proxy): the pool's queue, with
    admission; the upstream client; how many resumes a stream may have."""

    @property
    def max_resumes(self) -> int: ...

    @property
    def upstream(self) -> UpstreamClient: ...

    async def acquire(self, plan: Plan, ctx: RequestRecord) -> Lease: ...


class UpstreamFailed(Exception):
    """The upstream's stream broke without a transport error (see ``ResumeState.feed``).

    ``pending``: the events that came before the break in the same buffer; their ids are
    already counted as the client's, so the relay must send them before resuming."""

    def __init__(self, message: str, pending: bytes = b"") -> None:
        super().__init__(message)
        self.pending = pending


def not_resumable(body: dict) -> str | None:
    """Why a stream with this body cannot be resumed, or None if it can."""
    if (body.get("n") or 1) > 1 or (body.get("best_of") or 1) > 1:
        return "streams of n > 1 choices are not resumed"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
        return "streams of several prompts are not resumed"
    if body.get("tools") and body.get("tool_choice") != "none":
        return "streams parsed for tool calls are not resumed"
    return None


def is_engine(inst: Upstream) -> bool:
    """Whether an instance can continue a stream by token ids: an llmserve engine (it has ``/load``)."""
    return inst.load_source == "load"


def open_resume(body: dict, content: bytes, stream: bool, max_resumes: int) -> tuple[ResumeState | None, bytes]:
    """A stream's resume state (None when resuming is off or it is no stream) and the body
    for llmserve instances: asking for token ids when it will resume."""
    if not stream or not max_resumes:
        return None, content
    state = ResumeState(body)
    if state.why_not is not None or not state.strip:
        return state, content
    if "return_token_ids" in body:  # (false): the gateway's true must replace it
        return state, json.dumps({**json.loads(content), "return_token_ids": True}).encode()
    i = content.index(b"{") + 1  # a request body is an object with a model: a key follows
    return state, content[:i] + b'"return_token_ids": true, ' + content[i:]


class ResumeState:
    """One stream's resume bookkeeping: the token ids the client has, its head, the resumes left."""

    __slots__ = ("done", "head", "ids", "instance", "resumes", "strip", "upstream_head", "why_not")

    def __init__(self, body: dict) -> None:
        self.why_not = not_resumable(body)
        self.strip = not body.get("return_token_ids")  # the ids are the gateway's, not the client's
        self.ids: list[int] = []
        self.head: bytes | None = None  # the client stream's chunk head
        self.upstream_head: bytes | None = None  # the current upstream's, when it differs
        self.resumes = 0
        self.done = False
        self.instance = ""

    def start(self, inst: Upstream) -> None:
        """A new upstream's events follow (the first, or a resumed one)."""
        self.upstream_head, self.instance = None, inst.instance_id
        if self.why_not is None and not is_engine(inst):
            self.why_not = (f"instance {inst.instance_id} is not an llmserve engine: it cannot continue "
                            "a stream by token ids")

    def feed(self, events: bytes, datas: int | None = None) -> bytes:
        """Whole events from the upstream, as the client gets them: token ids kept (and
        stripped), the client's head restored. Raises ``UpstreamFailed`` after the events
        before an engine-dead error event, which the client is not sent. ``datas``: how
        often ``data: `` occurs in ``events`` (the relay counts it anyway).

        Nearly every buffer is one token chunk with its ids: that one costs two scans
        (the relay's count and the ids' key) instead of one per question below."""
        if datas is None:
            datas = events.count(b"data: ")
        if datas == 1 and self.why_not is None and self.upstream_head is not None:
            i = events.find(IDS_KEY)
            if i >= 0:
                # One data event with the ids' key is a chunk (the key cannot be inside a JSON
                # string): neither an error nor [DONE], and its head is this upstream's.
                j = events.index(b"]", i)
                if events.find(IDS_KEY, j) < 0:
                    inner = events[i + _IDS_LEN:j]
                    if b"," in inner:
                        self.ids += map(int, inner.split(b","))
                    elif inner:
                        self.ids.append(int(inner))
                    if self.strip:
                        events = events[:i] + events[j + 1:]
                    if self.upstream_head != self.head:
                        events = events.replace(self.upstream_head, self.head)
                    return events
        return self._feed(events)

    def _feed(self, events: bytes) -> bytes:
        """``feed`` for any buffer: several events, an error, [DONE], a first chunk."""
        failed = False
        if _DEAD in events:
            i = events.find(_DEAD)
            events, failed = events[:events.rfind(b"data: ", 0, i)], True
        if self.why_not is None:
            events, found = take_ids(events, self.ids, self.strip)
            if found < events.count(b'"choices": [{'):  # an instance that ignores return_token_ids
                self.why_not = f"instance {self.instance} sent chunks without their token ids"
        elif self.strip and IDS_KEY in events:
            events = take_ids(events, [])[0]
        m = HEAD.search(events) if self.upstream_head is None else None
        if m is not None:
            if self.head is None:
                self.head = m.group(1)
            self.upstream_head = m.group(1)
        if self.head is not None and self.upstream_head not in (None, self.head):
            events = events.replace(self.upstream_head, self.head)
        if DONE in events:
            self.done = True
        if failed:
            raise UpstreamFailed("the instance reported its engine dead", pending=events)
        return events

    def continuation(self, content: bytes) -> bytes:
        """The request body that continues this stream from the ids the client has."""
        body = json.loads(content)
        return json.dumps({**body, "return_token_ids": True, "resume_token_ids": self.ids}).encode()


async def relay(proxy: Attempts, plan: Plan, ctx: RequestRecord, current: Current, first: bytes,
                chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The client's stream from its first event on: relayed event by event, resumed on
    another instance when the upstream breaks, else ended with an error event.

    One upstream's events are relayed in this loop itself, not in a nested generator:
    each generator level costs every event a resume and a yield."""
    state: ResumeState | None = plan.resume
    outcome, status, kind = Outcome.NEUTRAL, current.resp.status_code, None
    try:
        while True:
            if state is not None:
                state.start(current.lease.instance)
            try:
                buf, more = first, chunks.__anext__
                while True:
                    if buf.endswith(b"\n\n"):  # the common case: upstreams write whole events
                        out, buf = buf, b""
                    else:
                        end = last_event_end(buf)
                        out, buf = buf[:end], buf[end:]
                    if out:
                        if ctx.ttft_s is None:
                            ctx.first_token()
                        datas = out.count(b"data: ")
                        if state is not None:
                            out = state.feed(out, datas)
                            done = state.done
                        else:
                            done = DONE in out
                        if done:
                            outcome = Outcome.SUCCESS  # the client has it all: a close now is no 499
                            datas -= out.count(DONE)
                        tab = ctx.tab  # a key with a budget: charged as it streams (gateway/tenants)
                        if tab is not None and ctx.output_tokens + datas > tab.next_at:
                            cut = await tab.charge(ctx.output_tokens + datas)
                            if cut is not None:  # its budget is spent: what it paid for, then why it ends
                                room = tab.room(ctx.output_tokens)
                                ctx.output_tokens += room
                                outcome, kind = Outcome.SUCCESS, "insufficient_quota"
                                yield first_events(out, room) + cut
                                return
                        ctx.output_tokens += datas
                        if out:
                            yield renamed(out, ctx.rename) if ctx.rename else out
                    try:
                        buf += await more()
                    except StopAsyncIteration:
                        break
                # Closing before [DONE] is a break when resuming: an instance killed at an
                # event's end looks like a clean close.
                if state is not None and not state.done:
                    raise UpstreamFailed("the stream ended before [DONE]")
                if buf:
                    yield buf
                outcome = Outcome.SUCCESS
                return
            except (httpx.HTTPError, UpstreamFailed) as e:
                pending = e.pending if isinstance(e, UpstreamFailed) else b""
                if pending:  # tokens before an engine-dead event in the same buffer: the client's
                    ctx.output_tokens += pending.count(b"data: ")
                    yield pending
                broke = f"the upstream instance failed mid-stream ({type(e).__name__})"
                log.warning("upstream %s broke mid-stream (%s): %s", current.lease.instance.instance_id,
                            ctx.request_id, e)
                why = "resuming is off" if state is None else state.why_not
                got = why if why is not None else await _resume(proxy, plan, ctx, current, state)
                if isinstance(got, str):
                    ctx.resumed("not_resumable" if why is not None else "failed")
                    outcome, status, kind = Outcome.FAILURE, 502, "stream_broken"
                    yield sse_error_event(f"{broke}; the response is incomplete and could not be resumed: "
                                          f"{got}", code="upstream_broken")
                    return
                first, chunks = got
    finally:
        end_stream(current.resp, current.lease, plan.pool, ctx, outcome, status, kind)
        if outcome is Outcome.FAILURE:  # (the broken upstream's lease was released when resuming)
            ctx.finish(status, ok=False, error_kind=kind)


async def _resume(proxy: Attempts, plan: Plan, ctx: RequestRecord, current: Current,
                  state: ResumeState) -> tuple[bytes, AsyncIterator[bytes]] | str:
    """The next upstream's first bytes and the rest, continuing the stream; or why none is."""
    plan.pool.release(current.lease, Outcome.FAILURE)
    current.resp.close()
    content = state.continuation(plan.content)
    last = "no resume was tried"
    while state.resumes < proxy.max_resumes:
        state.resumes += 1
        try:
            lease = await proxy.acquire(plan, ctx)
        except GatewayError as e:
            return f"no instance to resume on: {e.message}"
        inst = lease.instance
        if plan.adapter is not None and (failed := await adapter_ready(proxy.upstream, plan, lease)) is not None:
            last = failed.message
            continue
        plan.tried.append(inst.instance_id)
        ctx.resuming(inst.instance_id, plan.headers, len(state.ids))
        if not is_engine(inst):
            plan.pool.release(lease, Outcome.NEUTRAL)
            return f"instance {inst.instance_id} is not an llmserve engine: it cannot continue a stream by token ids"
        try:
            resp = await proxy.upstream.post(f"{inst.url}{plan.path}", content, plan.headers)
        except httpx.HTTPError as e:
            plan.pool.release(lease, Outcome.FAILURE)
            if unreachable(e):  # (as a first attempt's: the next resume waits for another)
                plan.pool.set_ready(inst, False)
            last = f"instance {inst.instance_id} failed: {type(e).__name__}: {e}"
            continue
        current.resp, current.lease = resp, lease  # from here the client's leaving frees this one
        if resp.status_code != 200 or not is_sse(resp):
            try:
                body = (await resp.aread())[:300].decode("utf-8", "replace")
            except httpx.HTTPError:
                body = ""
            resp.close()
            refused = resp.status_code < 500  # it cannot continue this request: neither could the others
            plan.pool.release(lease, Outcome.NEUTRAL if refused else Outcome.FAILURE)
            last = f"instance {inst.instance_id} answered {resp.status_code} to the continuation: {body}"
            if refused:
                return last
            continue
        got = await first_bytes(resp, lease, plan.pool)
        if isinstance(got, str):
            last = f"instance {inst.instance_id} broke off before its first event ({got})"
            continue
        log.info("stream %s resumed on %s after %d tokens", ctx.request_id, inst.instance_id, len(state.ids))
        ctx.retried()
        ctx.attempt_failed("stream_cut")
        ctx.resumed("resumed")
        return got
    return f"{state.resumes} resumes failed; last: {last}"
