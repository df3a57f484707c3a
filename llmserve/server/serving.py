"""Completions and chat completions over an engine client: validation, fan-out, SSE.

Everything a request needs is validated before the first byte is sent, so a bad
request gets a 4xx JSON error rather than a broken stream. A request that fails in
the engine after that fails alone: a 500 JSON error, or an SSE error event for its
choice while the other choices go on; a dead engine is a 503 (retry elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmserve.api.errors import APIError
from llmserve.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from llmserve.api.stream_format import sse
from llmserve.engine.client import EngineClient, EngineDeadError
from llmserve.engine.request import ContextLengthError
from llmserve.engine.llm import fan_out
from llmserve.engine.outputs import RequestOutput
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from llmserve.priority import parse_priority
from llmserve.server.chat_prompt import encode_chat
from llmserve.server.config import ServerConfig
from llmserve.server.formats import output_formats
from llmserve.server.lora_api import adapter_named
from llmserve.server.constraints import prompt_phase, structured_outputs
from llmserve.server.disconnect import until_disconnect
from llmserve.server.engine_errors import engine_error
from llmserve.server.responses import ChoiceWriter, ResponseMeta, mean_logprob, reasoning_total, usage
from llmserve.server.resume import check_resume
from llmserve.server.sampling_defaults import default_max_tokens, given, room_capped, sampling_defaults
from llmserve.server.stream_buffer import ReaderTooSlow, StreamBuffer
from llmserve.server.truncation import truncate_prompts
from llmserve.tracing.instance import request_telemetry

log = logging.getLogger(__name__)

_COMPILES = None


def _compiles():
    """One low-priority thread compiles this process's grammars (checks before the first byte)."""
    global _COMPILES
    if _COMPILES is None:
        from concurrent.futures import ThreadPoolExecutor

        from llmserve.engine.grammar import background_thread

        _COMPILES = ThreadPoolExecutor(1, thread_name_prefix="grammar-check", initializer=background_thread)
    return _COMPILES


@dataclass
class _Job:
    """One prompt of a request, expanded into ``n`` (or ``best_of``) engine sequences."""

    prompt_index: int
    prompt_ids: list[int]
    streams: list[AsyncIterator[RequestOutput]]
    request_ids: list[str]
    echo: str | None = None  # the prompt text, for completions' echo


class OpenAIServing:
    def __init__(self, engine: EngineClient, config: ServerConfig, model_name: str) -> None:
        self.engine = engine
        self.config = config
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.formats = output_formats(self.tokenizer, config)
        self.defaults = sampling_defaults(engine, config.generation_config)  # for what a request leaves out
        self.queued = 0  # accepted requests that have not produced their first token
        self.queued_tokens = 0
        self.in_flight = 0
        self.draining = False
        self._rng = random.Random()

    # ---- validation ----------------------------------------------------------------------
    def lora_of(self, model: str | None) -> str | None:  # (the adapter it names, server/lora_api.py)
        return adapter_named(self.engine, self.config.served_names(self.model_name), model)

    def check_model(self, model: str | None) -> None:
        if model and model not in self.config.served_names(self.model_name) and self.lora_of(model) is None:
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
            logprobs = r.logprobs
            if logprobs is not None and logprobs > cfg.max_logprobs:
                raise APIError(400, f"logprobs must be at most {cfg.max_logprobs}", param="logprobs")
        d = self.defaults
        if max_tokens is None:
            max_tokens = default_max_tokens(d, chat, cfg.max_tokens_limit)
        if r.n > cfg.max_n:
            raise APIError(400, f"n must be at most {cfg.max_n}, got {r.n}", param="n")
        if r.best_of is not None and r.best_of > cfg.max_n:
            raise APIError(400, f"best_of must be at most {cfg.max_n}, got {r.best_of}", param="best_of")
        n = max(r.n, r.best_of or 0)
        if n > r.n and logprobs is None:
            logprobs = 0  # best_of ranks by the sampled tokens' logprobs
        if max_tokens is not None and cfg.max_tokens_limit and max_tokens > cfg.max_tokens_limit:
            raise APIError(400, f"max_tokens must be at most {cfg.max_tokens_limit}, got {max_tokens}",
                           param="max_tokens")
        try:
            return SamplingParams(
                n=n, max_tokens=max_tokens, temperature=given(r.temperature, d, "temperature", 1.0),
                top_p=given(r.top_p, d, "top_p", 1.0), top_k=max(0, given(r.top_k, d, "top_k", 0)),
                min_p=given(r.min_p, d, "min_p", 0.0), seed=r.seed, stop=r.stop, stop_token_ids=r.stop_token_ids or [],
                ignore_eos=r.ignore_eos, min_tokens=r.min_tokens, logprobs=logprobs, presence_penalty=r.presence_penalty,
                frequency_penalty=r.frequency_penalty,
                repetition_penalty=given(r.repetition_penalty, d, "repetition_penalty", 1.0),
                include_stop_str_in_output=r.include_stop_str_in_output, truncate_prompt_tokens=r.truncate_prompt_tokens,
                skip_special_tokens=self.formats.skip_special_tokens(r.skip_special_tokens, r.tool_mode) if chat
                else r.skip_special_tokens,
                logit_bias={int(k): v for k, v in r.logit_bias.items()} if r.logit_bias else None,
                structured_outputs=structured_outputs(r, self.formats.reasoning_parser, self.formats.constrains_auto))
        except InvalidParameterError as e:
            raise APIError(400, str(e), param=e.param) from None

    async def compile_grammar(self, sp: SamplingParams, r: CompletionRequest | ChatCompletionRequest) -> None:
        """Compile the output constraint off the event loop (the engine caches it for add_request)."""
        if sp.structured_outputs is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(_compiles(), self.engine.compile_grammar, sp)
        except InvalidParameterError as e:
            field = (r.constraints() or ["tools"])[0]
            raise APIError(400, f"{field}: {str(e).removeprefix(e.param + ' ')}", param=field,
                           code="invalid_grammar") from None

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

    def _open(self, prompts: list[list[int]], sp: SamplingParams, raw: Request, priority, cache_salt,
              resume: list[int] | None = None, lora_name: str | None = None) -> list[_Job]:
        prio = self.priority(priority, raw)
        tel = request_telemetry(raw.scope)  # its traceparent: the engine's spans join the request's
        jobs: list[_Job] = []
        base = uuid.uuid4().hex[:16]
        try:
            for pi, ids in enumerate(prompts):
                job = _Job(pi, ids, [], [])
                for ci, child in enumerate(fan_out(sp)):
                    rid = f"{base}-{pi}-{ci}"
                    job.streams.append(self.engine.add_request(ids, child, rid, priority=prio, cache_salt=cache_salt,
                                                               resume_token_ids=resume, lora_name=lora_name,
                                                               trace=tel.traceparent if tel else None))
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
            raise engine_error(e) from None
        return jobs

    def _abort(self, jobs: list[_Job]) -> None:
        for job in jobs:
            for rid in job.request_ids:
                self.engine.abort(rid)

    # ---- entry points ------------------------------------------------------------------------
    async def completions(self, r: CompletionRequest, raw: Request):
        self.check_model(r.model)
        sp = self.sampling_params(r, chat=False)
        prompts = truncate_prompts(self._completion_prompts(r.prompt), sp.truncate_prompt_tokens, self.engine.max_model_len)
        await self.compile_grammar(sp, r)
        echo = [self.tokenizer.decode(p) for p in prompts] if r.echo else None
        return await self._serve(prompts, sp, r, raw, chat=False, echo=echo)

    async def chat(self, r: ChatCompletionRequest, raw: Request):
        self.check_model(r.model)
        sp = self.sampling_params(r, chat=True)
        tools = [t.model_dump(exclude_none=True) for t in r.tools] if r.tools and r.tool_mode != "none" else None
        self.formats.check_thinking(self.tokenizer, raw.headers, bool(tools))
        ids = self.encode_chat(r.messages, r.add_generation_prompt, tools, r.chat_template_kwargs or {},
                               r.continue_final_message, r.tool_mode)
        await self.compile_grammar(sp, r)
        return await self._serve(truncate_prompts([ids], sp.truncate_prompt_tokens, self.engine.max_model_len),
                                 sp, r, raw, chat=True)

    def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                    tools: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None,
                    continue_final_message: bool = False, tool_mode: str = "auto") -> list[int]:
        return encode_chat(self.tokenizer, [m.for_template() for m in messages], add_generation_prompt, tools,
                           kwargs or {}, continue_final_message, self.formats.tool_parser_for(tool_mode))

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
                     echo: list[str] | None = None):
        n_tokens = sum(len(p) for p in prompts)
        sp = room_capped(sp, self.defaults, r, prompts, self.engine.max_model_len)
        resume = check_resume(r, len(prompts))
        self._admit(n_tokens)
        tracker = _Tracker(self, n_tokens, request_telemetry(raw.scope))
        try:
            await self._inject_faults()
            lora = self.lora_of(r.model)
            jobs = self._open(prompts, sp, raw, r.priority, r.cache_salt, resume, lora)
        except BaseException:
            tracker.done()
            raise
        for job in jobs:
            job.echo = echo[job.prompt_index] if echo else None
        tool_calls = chat and r.tool_mode != "none"
        meta = ResponseMeta(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()), lora or self.model_name,
                            chat, r.n, r.logprobs is not None and r.logprobs is not False, tool_calls,
                            chat and r.parallel_tool_calls, r.return_token_ids, resume,
                            self.formats.tool_parser_for(r.tool_mode) if chat else "hermes",
                            self.formats.reasoning_parser if chat else None,
                            prompt_phase(self.formats.reasoning_parser, self.tokenizer, prompts[0]) if chat else None,
                            self.formats.call_ids(), tool_mode=r.tool_mode if chat else "none")
        if r.stream:
            so = r.stream_options
            include_usage = 2 if so and so.include_usage and so.continuous_usage_stats else int(bool(so and so.include_usage))
            return StreamingResponse(self._sse(jobs, meta, include_usage, tracker), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            finals = await until_disconnect(raw, self._collect(jobs, tracker))
        except Exception as e:  # noqa: BLE001 - whatever ended it, the client gets OpenAI's error JSON
            raise engine_error(e) from None
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
                    tracker.finished(out)

        await asyncio.gather(*(drain(rid, s) for j in jobs for rid, s in zip(j.request_ids, j.streams)))
        return finals

    # ---- response bodies ----------------------------------------------------------------------
    def _final_body(self, jobs: list[_Job], finals: dict[str, RequestOutput], meta: ResponseMeta) -> dict[str, Any]:
        choices, writers = [], []
        completion_tokens = cached = 0
        for job in jobs:
            outs = [finals[rid] for rid in job.request_ids]
            completion_tokens += sum(len(o.outputs[0].token_ids) for o in outs)  # best_of's too: all were made
            if len(outs) > meta.n:  # best_of: the n with the highest logprob per token, in that order
                outs = sorted(outs, key=mean_logprob, reverse=True)[:meta.n]
            for ci, out in enumerate(outs):
                writers.append(ChoiceWriter(job.prompt_index * meta.n + ci, meta, self.tokenizer, job.echo))
                choices.append(writers[-1].final(out))
            cached += outs[0].num_cached_tokens
        prompt_tokens = sum(len(j.prompt_ids) for j in jobs)
        body = meta.envelope(choices, usage=usage(prompt_tokens, completion_tokens, cached, reasoning_total(writers)))
        body["object"] = "chat.completion" if meta.chat else "text_completion"
        return body

    async def _sse(self, jobs: list[_Job], meta: ResponseMeta, include_usage: int, tracker: "_Tracker"):
        """``include_usage``: 1 the usage chunk at the end, 2 also the usage so far in every chunk."""
        writers: dict[int, ChoiceWriter] = {}
        streams = []
        for j in jobs:
            for ci, s in enumerate(j.streams):
                idx = j.prompt_index * meta.n + ci
                writers[idx] = ChoiceWriter(idx, meta, self.tokenizer, j.echo)
                streams.append((idx, s))
        buf = StreamBuffer(streams, self.config.stream_buffer_outputs * len(streams), lambda: self._abort(jobs))
        completion_tokens = cached = 0
        prompt_tokens, made = sum(len(j.prompt_ids) for j in jobs), {}
        try:
            while (got := await buf.get()) is not None:
                idx, item = got
                if isinstance(item, Exception):
                    yield sse(engine_error(item).body())
                    continue
                tracker.first_token()
                if self.config.fault_chunk_latency_ms:
                    await asyncio.sleep(self.config.fault_chunk_latency_ms / 1000)
                if item.finished:
                    tracker.finished(item)
                    completion_tokens += len(item.outputs[0].token_ids)
                    if idx % meta.n == 0:
                        cached += item.num_cached_tokens
                so_far = None
                if include_usage > 1:  # continuous_usage_stats (the whole fields come at the end only)
                    made[idx] = made.get(idx, 0) + len(item.outputs[0].delta_token_ids)
                    so_far = usage(prompt_tokens, sum(made.values()), item.num_cached_tokens)
                for choice in writers[idx].chunks(item):
                    yield sse(meta.envelope([choice], usage=so_far) if so_far else meta.envelope([choice]))
            if include_usage:
                u = usage(prompt_tokens, completion_tokens, cached, reasoning_total(writers.values()))
                yield sse(meta.envelope([], usage=u))
            yield "data: [DONE]\n\n"
        except ReaderTooSlow as e:  # the request is aborted; if the client reads again, it learns why
            log.info("stream %s cut: %s", meta.id, e)
            yield sse({"error": {"message": f"the stream was cut: {e}", "type": "server_error", "param": None,
                                 "code": "client_too_slow"}})
        finally:
            buf.close()
            self._abort(jobs)
            tracker.done()


class _Tracker:
    """Keeps the server's queued / in-flight counts right however a request ends."""

    def __init__(self, serving: OpenAIServing, prompt_tokens: int, telemetry=None) -> None:
        self.s, self.tokens, self.waiting, self.open = serving, prompt_tokens, True, True
        self.telemetry = telemetry  # the request's (llmserve.tracing.instance), if any
        serving.queued += 1
        serving.queued_tokens += prompt_tokens
        serving.in_flight += 1

    def first_token(self) -> None:
        if self.waiting:
            self.waiting = False
            self.s.queued -= 1
            self.s.queued_tokens -= self.tokens

    def finished(self, out: RequestOutput) -> None:
        if self.telemetry is not None:
            self.telemetry.output(out)

    def done(self) -> None:
        self.first_token()
        if self.open:
            self.open = False
            self.s.in_flight -= 1
