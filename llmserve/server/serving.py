"""Completions and chat completions over the AsyncEngine: validation, fan-out, SSE.

Everything a request needs is validated before the first byte is sent, so a bad
request gets a 4xx JSON error rather than a broken stream. A request that fails in
the engine after that fails alone: a 500 JSON error, or an SSE error event for its
choice while the other choices go on; a dead engine is a 503 (retry elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmserve.engine.async_engine import AsyncEngine, EngineDeadError, RequestFailedError
from llmserve.engine.engine import ContextLengthError
from llmserve.engine.llm import fan_out
from llmserve.engine.outputs import RequestOutput, TokenLogprob
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from llmserve.priority import parse_priority
from llmserve.server.config import ServerConfig
from llmserve.api.errors import APIError
from llmserve.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from llmserve.server.stream_buffer import ReaderTooSlow, StreamBuffer

log = logging.getLogger(__name__)


@dataclass
class _Job:
    """One prompt of a request, expanded into ``n`` engine sequences."""

    prompt_index: int
    prompt_ids: list[int]
    streams: list[AsyncIterator[RequestOutput]]
    request_ids: list[str]


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, config: ServerConfig, model_name: str) -> None:
        self.engine = engine
        self.config = config
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.queued = 0  # accepted requests that have not produced their first token
        self.queued_tokens = 0
        self.in_flight = 0
        self.draining = False
        self._rng = random.Random()

    # ---- validation ----------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model and model not in self.config.served_names(self.model_name):
            raise APIError(404, f"The model `{model}` does not exist.", "not_found_error", "model",
                           "model_not_found")

    def sampling_params(self, r: CompletionRequest | ChatCompletionRequest, *, chat: bool) -> SamplingParams:
        cfg = self.config
        max_tokens = r.max_tokens
        logprobs: int | None
        if chat:
            assert isinstance(r, ChatCompletionRequest)
            if r.max_completion_tokens is not None:
                max_tokens = r.max_completion_tokens
            logprobs = (r.top_logprobs or 0) if r.logprobs else None
            if r.top_logprobs is not None and r.top_logprobs > cfg.max_logprobs:
                raise APIError(400, f"top_logprobs must be at most {cfg.max_logprobs}", param="top_logprobs")
        else:
            assert isinstance(r, CompletionRequest)
            if max_tokens is None:
                max_tokens = 16
            logprobs = r.logprobs
            if logprobs is not None and logprobs > cfg.max_logprobs:
                raise APIError(400, f"logprobs must be at most {cfg.max_logprobs}", param="logprobs")
        if r.n > cfg.max_n:
            raise APIError(400, f"n must be at most {cfg.max_n}, got {r.n}", param="n")
        if max_tokens is not None and cfg.max_tokens_limit and max_tokens > cfg.max_tokens_limit:
            raise APIError(400, f"max_tokens must be at most {cfg.max_tokens_limit}, got {max_tokens}",
                           param="max_tokens")
        try:
            return SamplingParams(
                n=r.n, max_tokens=max_tokens, temperature=1.0 if r.temperature is None else r.temperature,
                top_p=1.0 if r.top_p is None else r.top_p, top_k=max(0, r.top_k or 0),
                min_p=r.min_p or 0.0, seed=r.seed, stop=r.stop, stop_token_ids=r.stop_token_ids or [],
                ignore_eos=r.ignore_eos, logprobs=logprobs, presence_penalty=r.presence_penalty,
                frequency_penalty=r.frequency_penalty,
                repetition_penalty=1.0 if r.repetition_penalty is None else r.repetition_penalty,
                include_stop_str_in_output=r.include_stop_str_in_output,
                skip_special_tokens=r.skip_special_tokens)
        except InvalidParameterError as e:
            raise APIError(400, str(e), param=e.param) from None

    def _admit(self, prompt_tokens: int) -> None:
        cfg = self.config
        if self.draining:
            raise APIError(503, "the server is draining; retry on another instance", "service_unavailable",
                           headers={"Retry-After": "1"})
        if self.queued >= cfg.max_queued_requests or self.queued_tokens + prompt_tokens > cfg.max_queued_prompt_tokens:
            raise APIError(503, f"the server is overloaded ({self.queued} requests queued); retry later",
                           "service_unavailable", code="overloaded", headers={"Retry-After": "1"})

    async def _inject_faults(self) -> None:
        cfg = self.config
        if cfg.fault_latency_ms:
            await asyncio.sleep(cfg.fault_latency_ms / 1000)
        if cfg.fault_error_rate and self._rng.random() < cfg.fault_error_rate:
            raise APIError(500, "injected fault", "server_error")

    def priority(self, body_priority: int | str | None, raw: Request) -> int | None:
        """The request's priority (the body's, else ``x-priority``), within the configured range."""
        claimed = body_priority if body_priority is not None else raw.headers.get("x-priority")
        try:
            return parse_priority(claimed, self.config.priority_range)
        except ValueError as e:
            raise APIError(400, str(e), param="priority", code="invalid_priority") from None

    def _open(self, prompts: list[list[int]], sp: SamplingParams, raw: Request, priority, cache_salt) -> list[_Job]:
        prio = self.priority(priority, raw)
        jobs: list[_Job] = []
        base = uuid.uuid4().hex[:16]
        try:
            for pi, ids in enumerate(prompts):
                job = _Job(pi, ids, [], [])
                for ci, child in enumerate(fan_out(sp)):
                    rid = f"{base}-{pi}-{ci}"
                    job.streams.append(self.engine.add_request(ids, child, rid, priority=prio, cache_salt=cache_salt))
                    job.request_ids.append(rid)
                jobs.append(job)
        except ContextLengthError as e:
            self._abort(jobs)
            raise APIError(400, str(e), param="prompt", code="context_length_exceeded") from None
        except InvalidParameterError as e:
            self._abort(jobs)
            raise APIError(400, str(e), param=e.param) from None
        except ValueError as e:
            self._abort(jobs)
            raise APIError(400, str(e)) from None
        except EngineDeadError as e:
            self._abort(jobs)
            raise _engine_error(e) from None
        return jobs

    def _abort(self, jobs: list[_Job]) -> None:
        for job in jobs:
            for rid in job.request_ids:
                self.engine.abort(rid)

    # ---- entry points ------------------------------------------------------------------------
    async def completions(self, r: CompletionRequest, raw: Request):
        self.check_model(r.model)
        sp = self.sampling_params(r, chat=False)
        prompts = self._completion_prompts(r.prompt)
        return await self._serve(prompts, sp, r, raw, chat=False,
                                 prompt_texts=[r.prompt] if isinstance(r.prompt, str) else None)

    async def chat(self, r: ChatCompletionRequest, raw: Request):
        self.check_model(r.model)
        sp = self.sampling_params(r, chat=True)
        ids = self.encode_chat(r.messages, r.add_generation_prompt)
        return await self._serve([ids], sp, r, raw, chat=True)

    def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool) -> list[int]:
        try:
            return self.tokenizer.encode_chat([m.for_template() for m in messages],
                                              add_generation_prompt=add_generation_prompt)
        except Exception as e:  # noqa: BLE001 - template errors (raise_exception too) are the caller's input
            raise APIError(400, f"cannot apply the chat template: {e}", param="messages") from None

    def _completion_prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [prompt]
        elif not prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        elif isinstance(prompt[0], int):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        out = []
        for p in prompts:
            if isinstance(p, str):
                if not p:
                    raise APIError(400, "prompt must not be empty", param="prompt")
                out.append(self.tokenizer.encode(p))
            else:
                if not p:
                    raise APIError(400, "prompt must not be empty", param="prompt")
                out.append(list(p))
        if len(out) > self.config.max_batch_prompts:
            raise APIError(400, f"at most {self.config.max_batch_prompts} prompts per request", param="prompt")
        return out

    async def _serve(self, prompts: list[list[int]], sp: SamplingParams, r, raw: Request, *, chat: bool,
                     prompt_texts=None):
        n_tokens = sum(len(p) for p in prompts)
        self._admit(n_tokens)
        tracker = _Tracker(self, n_tokens)
        try:
            await self._inject_faults()
            jobs = self._open(prompts, sp, raw, r.priority, r.cache_salt)
        except BaseException:
            tracker.done()
            raise
        meta = _Meta(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()), self.model_name,
                     chat, sp.n, sp.logprobs is not None)
        if r.stream:
            include_usage = bool(r.stream_options and r.stream_options.include_usage)
            return StreamingResponse(self._sse(jobs, meta, include_usage, tracker), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            finals = await _until_disconnect(raw, self._collect(jobs, tracker))
        except (RequestFailedError, EngineDeadError) as e:
            raise _engine_error(e) from None
        finally:
            self._abort(jobs)
            tracker.done()
        return JSONResponse(self._final_body(jobs, finals, meta))

    async def _collect(self, jobs: list[_Job], tracker: "_Tracker") -> dict[str, RequestOutput]:
        finals: dict[str, RequestOutput] = {}

        async def drain(rid: str, stream: AsyncIterator[RequestOutput]) -> None:
            async for out in stream:
                tracker.first_token()
                if out.finished:
                    finals[rid] = out

        await asyncio.gather(*(drain(rid, s) for j in jobs for rid, s in zip(j.request_ids, j.streams)))
        return finals

    # ---- response bodies ----------------------------------------------------------------------
    def _final_body(self, jobs: list[_Job], finals: dict[str, RequestOutput], meta: "_Meta") -> dict[str, Any]:
        choices = []
        completion_tokens = cached = 0
        for job in jobs:
            for ci, rid in enumerate(job.request_ids):
                out = finals[rid]
                c = out.outputs[0]
                completion_tokens += len(c.token_ids)
                idx = job.prompt_index * meta.n + ci
                lp = self._logprobs(c.logprobs, meta.chat) if meta.logprobs else None
                if meta.chat:
                    choices.append({"index": idx, "message": {"role": "assistant", "content": c.text},
                                    "logprobs": lp, "finish_reason": c.finish_reason,
                                    "stop_reason": c.stop_reason})
                else:
                    choices.append({"index": idx, "text": c.text, "logprobs": lp,
                                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
            cached += finals[job.request_ids[0]].num_cached_tokens
        prompt_tokens = sum(len(j.prompt_ids) for j in jobs)
        return {"id": meta.id, "object": "chat.completion" if meta.chat else "text_completion",
                "created": meta.created, "model": meta.model, "choices": choices,
                "usage": _usage(prompt_tokens, completion_tokens, cached)}

    def _logprobs(self, lps: list[TokenLogprob] | None, chat: bool) -> dict[str, Any] | None:
        if lps is None:
            return None
        tok = self.tokenizer
        if chat:
            content = []
            for lp in lps:
                s = tok.decode([lp.token_id], skip_special_tokens=False)
                content.append({"token": s, "logprob": lp.logprob, "bytes": list(s.encode()),
                                "top_logprobs": [{"token": (t := tok.decode([i], skip_special_tokens=False)),
                                                  "logprob": v, "bytes": list(t.encode())} for i, v in lp.top]})
            return {"content": content}
        tokens, token_lps, tops, offsets, pos = [], [], [], [], 0
        for lp in lps:
            s = tok.decode([lp.token_id], skip_special_tokens=False)
            tokens.append(s)
            token_lps.append(lp.logprob)
            tops.append({tok.decode([i], skip_special_tokens=False): v for i, v in lp.top} if lp.top else None)
            offsets.append(pos)
            pos += len(s)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    async def _sse(self, jobs: list[_Job], meta: "_Meta", include_usage: bool, tracker: "_Tracker"):
        streams = [(j.prompt_index * meta.n + ci, s) for j in jobs for ci, s in enumerate(j.streams)]
        buf = StreamBuffer(streams, self.config.stream_buffer_outputs * len(streams), lambda: self._abort(jobs))
        completion_tokens = cached = 0
        sent_role: set[int] = set()
        try:
            while (got := await buf.get()) is not None:
                idx, item = got
                if isinstance(item, Exception):
                    yield _sse(_engine_error(item).body())
                    continue
                tracker.first_token()
                c = item.outputs[0]
                if item.finished:
                    completion_tokens += len(c.token_ids)
                    if idx % meta.n == 0:
                        cached += item.num_cached_tokens
                if not (c.delta_text or item.finished or c.delta_token_ids) and idx in sent_role:
                    continue
                lp = self._logprobs(c.delta_logprobs, meta.chat) if meta.logprobs else None
                if meta.chat:
                    delta: dict[str, Any] = {"content": c.delta_text}
                    if idx not in sent_role:
                        delta["role"] = "assistant"
                        sent_role.add(idx)
                    choice = {"index": idx, "delta": delta, "logprobs": lp,
                              "finish_reason": c.finish_reason if item.finished else None}
                else:
                    choice = {"index": idx, "text": c.delta_text, "logprobs": lp,
                              "finish_reason": c.finish_reason if item.finished else None}
                if item.finished:
                    choice["stop_reason"] = c.stop_reason
                yield _sse({"id": meta.id, "object": "chat.completion.chunk" if meta.chat else "text_completion",
                            "created": meta.created, "model": meta.model, "choices": [choice]})
            if include_usage:
                prompt_tokens = sum(len(j.prompt_ids) for j in jobs)
                yield _sse({"id": meta.id, "object": "chat.completion.chunk" if meta.chat else "text_completion",
                            "created": meta.created, "model": meta.model, "choices": [],
                            "usage": _usage(prompt_tokens, completion_tokens, cached)})
            yield "data: [DONE]\n\n"
        except ReaderTooSlow as e:  # the request is aborted; if the client reads again, it learns why
            log.info("stream %s cut: %s", meta.id, e)
            yield _sse({"error": {"message": f"the stream was cut: {e}", "type": "server_error", "param": None,
                                  "code": "client_too_slow"}})
        finally:
            buf.close()
            self._abort(jobs)
            tracker.done()


@dataclass
class _Meta:
    id: str
    created: int
    model: str
    chat: bool
    n: int
    logprobs: bool


class _Tracker:
    """Keeps the server's queued / in-flight counts right however a request ends."""

    def __init__(self, serving: OpenAIServing, prompt_tokens: int) -> None:
        self.s, self.tokens, self.waiting, self.open = serving, prompt_tokens, True, True
        serving.queued += 1
        serving.queued_tokens += prompt_tokens
        serving.in_flight += 1

    def first_token(self) -> None:
        if self.waiting:
            self.waiting = False
            self.s.queued -= 1
            self.s.queued_tokens -= self.tokens

    def done(self) -> None:
        self.first_token()
        if self.open:
            self.open = False
            self.s.in_flight -= 1


def _engine_error(e: Exception) -> APIError:
    """What the client is told when the engine ends its request with an error."""
    if isinstance(e, EngineDeadError):
        return APIError(503, f"the engine failed: {e}; retry on another instance", "service_unavailable",
                        code="engine_dead", headers={"Retry-After": "1"})
    if isinstance(e, RequestFailedError):
        return APIError(500, f"the request failed: {e}", "server_error", code="request_failed")
    return APIError(500, str(e) or type(e).__name__, "server_error")


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _until_disconnect(raw: Request, coro):
    """Run ``coro`` but cancel it as soon as the client goes away (non-streaming requests).

    The body is read by now, so the next ASGI message can only be the disconnect:
    one task waits for it (polling ``Request.is_disconnected`` instead costs a
    wake-up per interval and adds up to that interval to every abort)."""
    task = asyncio.ensure_future(coro)
    gone = asyncio.ensure_future(_disconnected(raw.receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise APIError(499, "client disconnected", "invalid_request_error")
        return task.result()
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
