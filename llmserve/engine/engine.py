"""The synchronous engine core: ``step()`` = schedule, run, update.

Everything stateful about one request's *text* (detokenisation, stop strings,
logprobs) lives here; token accounting lives in the scheduler, KV in the KV
manager, tensors in the runner.

One bad request never hurts another: a request whose scheduling, sampling or text
raises is failed alone (its final output has ``finish_reason == "error"`` and
``error`` set, its KV blocks are freed) and the step goes on without it. Only a
fault of the whole batch, the forward pass itself, makes ``step()`` raise.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmserve.engine.config import EngineConfig
from llmserve.engine.guided import GuidedDecoding
from llmserve.engine.kv_budget import available_memory
from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from llmserve.engine.request import REALTIME, ContextLengthError, Request, RequestStatus
from llmserve.engine.runner import ModelRunner
from llmserve.engine.sampler import SampleRow, Sampler, StepSamples
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from llmserve.engine.scheduler import Scheduler, SchedulerConfig
from llmserve.engine.stats import EngineStats, load_snapshot
from llmserve.models.config import ModelConfig
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.quant import round_activations
from llmserve.priority import parse_priority

log = logging.getLogger(__name__)


@dataclass
class _Track:
    """Per-request text state kept beside the scheduler's token state."""

    request: Request
    detok: Any
    prompt: str | None
    generator: torch.Generator | None
    metrics: RequestMetrics
    text: str = ""
    emitted: int = 0  # chars of text already handed out
    num_tokens_emitted: int = 0
    logprobs: list[TokenLogprob] | None = None
    hold_back: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None


class EngineCore:
    """One model, one KV pool, one scheduler; not thread-safe (AsyncEngine serialises)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig,
                 weights: dict[str, torch.Tensor], tokenizer: Any | None = None,
                 prepared_dir: Path | None = None) -> None:
        """``prepared_dir``: where the model store keeps prepared (int8) weights, if anywhere."""
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        if config.threads:
            torch.set_num_threads(config.threads)
        from llmserve.models.weights import PreparedCache, linear_factory_for, resolve_dtype

        config.dtype = resolve_dtype(config.dtype, model_config.quantized_source)
        factory = linear_factory_for(config.dtype, prepared_dir, exact=config.exact_activations)
        self.model = LlamaForCausalLM(model_config, weights, factory)
        if not config.exact_activations:
            round_activations(self.model)  # one byte where quality holds (int8 layers only)
        if isinstance(factory, PreparedCache):
            factory.save()
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        if config.kv_cache_dtype == "auto":
            config.kv_cache_dtype = "fp16" if config.dtype == "int8" else "fp32"
        kv_dtype = torch.float16 if config.kv_cache_dtype == "fp16" else torch.float32
        num_blocks = config.num_blocks_for(model_config.kv_bytes_per_token(kv_dtype.itemsize),
                                           self.max_model_len, available_memory())
        self.max_model_len = min(self.max_model_len, num_blocks * config.block_size)
        self.kv = KVCacheManager(num_blocks, config.block_size,
                                 enable_prefix_caching=config.enable_prefix_caching,
                                 model_key=model_config.name)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            batch_min_share=config.batch_min_share,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            step_budget_tokens=config.step_budget_tokens, step_time_budget_s=config.step_time_budget_s), self.kv)
        self.runner = ModelRunner(self.model, self.kv, kv_dtype)
        self.sampler = Sampler(config.seed)
        self.stats = EngineStats()
        self.eos_token_ids = frozenset(model_config.eos_token_id or [])
        if tokenizer is not None:
            self.eos_token_ids |= frozenset(getattr(tokenizer, "eos_token_ids", []) or [])
        self._tracks: dict[str, _Track] = {}
        self._guided: GuidedDecoding | None = None  # built with the first structured-output request
        self._guided_lock = threading.Lock()
        self.spec = None
        if config.speculative_config is not None:
            from llmserve.engine.spec_decode import SpeculativeDecoder

            self.spec = SpeculativeDecoder(config.speculative_config, self)

    # ---- requests --------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    *, priority: int | str | None = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None) -> Request:
        """Validate and queue; raises ``ValueError`` (or ``InvalidParameterError``) on bad input."""
        req, prompt_text = self.prepare_request(request_id, prompt, params, priority=priority,
                                                cache_salt=cache_salt, arrival_time=arrival_time)
        self.enqueue(req, prompt_text)
        return req

    def prepare_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                        *, priority: int | str | None = 0, cache_salt: str | None = None,
                        arrival_time: float | None = None) -> tuple[Request, str | None]:
        """Tokenise and check a request without touching engine state (safe from any thread)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass token ids")
            if not prompt:
                raise InvalidParameterError("prompt", "must not be empty")
            prompt_ids = self.tokenizer.encode(prompt)
            prompt_text: str | None = prompt
        else:
            prompt_ids = [int(t) for t in prompt]
            prompt_text = None
        if not prompt_ids:
            raise InvalidParameterError("prompt", "must not be empty")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise InvalidParameterError("cache_salt", "must be a string")
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_ids):
            raise InvalidParameterError("prompt", f"has token ids outside the vocabulary [0, {vocab})")
        n_prompt = len(prompt_ids)
        if n_prompt >= self.max_model_len:
            raise ContextLengthError(n_prompt, self.max_model_len)
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n_prompt
        if n_prompt + max_tokens > self.max_model_len:
            raise ContextLengthError(n_prompt, self.max_model_len, max_tokens)
        try:
            prio = parse_priority(priority)
        except ValueError as e:
            raise InvalidParameterError("priority", str(e).removeprefix("priority ")) from None
        prio = REALTIME if prio is None else prio
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise InvalidParameterError("logit_bias", f"has token ids outside the vocabulary [0, {vocab})")
        grammar = self.compile_grammar(params)
        now = arrival_time if arrival_time is not None else time.monotonic()
        req = Request(request_id, prompt_ids, params, max_tokens, arrival_time=now, priority=prio,
                      cache_salt=cache_salt, eos_token_ids=self.eos_token_ids, grammar=grammar)
        return req, prompt_text

    @property
    def guided(self) -> GuidedDecoding | None:
        """Grammar matchers of structured-output requests; None until the first one."""
        return self._guided

    def compile_grammar(self, params: SamplingParams):
        """The compiled grammar of ``params.structured_outputs`` (None without one); safe from any
        thread and cached, so a server compiles in a worker thread before ``add_request``."""
        if params.structured_outputs is None:
            return None
        with self._guided_lock:  # one tokenizer info per engine (~0.4 s for 49k tokens)
            if self._guided is None:
                self._guided = GuidedDecoding.for_tokenizer(self.tokenizer, self.model_config.vocab_size,
                                                            self.eos_token_ids)
        return self._guided.backend.compile(params.structured_outputs)

    def enqueue(self, req: Request, prompt_text: str | None = None) -> None:
        """Hand a prepared request to the scheduler (engine thread only).

        All or nothing: whatever raises here leaves no trace of the request.
        """
        params = req.sampling_params
        gen = None
        if params.seed is not None:
            gen = torch.Generator()
            gen.manual_seed(params.seed)
        detok = None
        if self.tokenizer is not None:
            detok = self.tokenizer.detokenizer(req.prompt_token_ids, params.skip_special_tokens)
        track = _Track(req, detok, prompt_text, gen, RequestMetrics(req.arrival_time),
                       logprobs=[] if params.logprobs is not None else None,
                       hold_back=max((len(s) for s in params.stop), default=1) - 1)
        matcher = self._guided.matcher(req.grammar, req.output_token_ids) if req.grammar is not None else None
        self.scheduler.add_request(req)
        self._tracks[req.request_id] = track
        if matcher is not None:
            self._guided.add(req.request_id, matcher)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Drop a request wherever it is; its KV blocks are freed at once."""
        req = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        tr = self._forget(request_id)
        if req is None or tr is None:
            return None
        tr.finish_reason = "abort"
        tr.metrics.finished_time = time.monotonic()
        self.stats.on_finished(req, "abort", tr.metrics)
        return self._output(tr, finished=True)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- the step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run, sample, update; raises only when the forward pass itself fails."""
        self._propose()
        plan = self.scheduler.schedule(self.stats.step_costs())  # chunks sized by measured step time
        t0 = time.monotonic()
        outputs = [self._fail(tr, r.error, t0) for r in plan.failed if (tr := self._tracks.get(r.request_id))]
        if plan.empty:
            return outputs
        self._note_scheduled(plan, t0)
        guided = self._guided
        pending = guided.start(plan) if guided else None  # masks fill while the model runs
        run = self.runner.execute(plan)
        samples = self._sample(plan, run, GuidedDecoding.masks(pending))
        complete = guided.commit(samples) if guided else []  # (skips, or adds to, samples.failed)
        for rid, why in samples.failed.items():
            self.scheduler.fail_request(rid, f"sampling failed: {why}")
        t1 = time.monotonic()
        self.stats.on_step(t0, t1, plan)
        finished = self.scheduler.update_from_output(plan, samples.tokens)
        finished_ids = {r.request_id for r in finished}
        for rid in complete:  # the grammar ended (matters with ignore_eos; otherwise the stop token did)
            if rid not in finished_ids and self.scheduler.finish_request(rid, RequestStatus.FINISHED_STOPPED):
                finished_ids.add(rid)
        return outputs + self._postprocess(plan, samples, finished_ids, t1)

    def _note_scheduled(self, plan, now: float) -> None:
        for s in plan.scheduled:
            tr = self._tracks[s.request.request_id]
            if tr.metrics.first_scheduled_time is None:
                tr.metrics.first_scheduled_time = now
                self.stats.on_first_scheduled(s.request, now)

    def _postprocess(self, plan, samples: StepSamples, finished_ids: set[str], now: float) -> list[RequestOutput]:
        """Text and outputs for every request the step touched; a failure ends only its own request."""
        outputs = []
        for s in plan.scheduled:
            req = s.request
            tr = self._tracks.get(req.request_id)
            if tr is None:
                continue
            if req.status is RequestStatus.FINISHED_ERROR:
                outputs.append(self._fail(tr, req.error, now))
            elif req.request_id in samples.tokens:
                lps = samples.logprobs.get(req.request_id, [])
                try:
                    outputs.append(self._advance(tr, lps, now, req.request_id in finished_ids))
                except Exception as e:  # noqa: BLE001 - its detokeniser or stop check: it fails alone
                    outputs.append(self._fail(tr, f"detokenisation failed: {e}", now))
        return outputs

    def _propose(self) -> None:
        """Draft tokens for the next step; a failing proposer only costs this step its drafts."""
        if self.spec is None:
            return
        try:
            self.spec.propose(self.scheduler.running)
        except Exception:  # noqa: BLE001 - speculation is lossless to skip
            log.exception("speculative proposal failed; this step runs without drafts")
            for r in self.scheduler.running:
                r.spec_token_ids = []

    def _sample(self, plan, run, masks: dict[str, torch.Tensor]) -> StepSamples:
        if self.spec is not None:
            return self.spec.verify(plan, run, self._row, masks)
        out = StepSamples()
        rows, order, idx = [], [], []
        for s in plan.scheduled:
            if s.sample:
                mask = masks.get(s.request.request_id)
                rows.append(self._row(s.request, allowed=None if mask is None else mask[0]))
                order.append(s.request.request_id)
                idx.append(run.rows[s.request.request_id][0])
        if not rows:
            return out
        logits = run.logits
        if idx != list(range(logits.shape[0])):  # (advanced indexing costs ~50 us even for one row)
            logits = logits.index_select(0, torch.tensor(idx, dtype=torch.long))
        for rid, tok in zip(order, self.sampler.sample(logits, rows)):
            if tok.error is not None:
                out.failed[rid] = tok.error
                continue
            out.tokens[rid] = [tok.token_id]
            if tok.logprob is not None:
                out.logprobs[rid] = [TokenLogprob(tok.token_id, tok.logprob, tok.top_logprobs or [])]
        return out

    def _row(self, req: Request, extra_output: list[int] | None = None,
             allowed: torch.Tensor | None = None) -> SampleRow:
        out = req.output_token_ids + (extra_output or [])
        return SampleRow(req.sampling_params, req.prompt_token_ids, out, self._tracks[req.request_id].generator,
                         allowed)

    def _advance(self, tr: _Track, lps: list[TokenLogprob], now: float, finished: bool) -> RequestOutput:
        req = tr.request
        new_ids = req.output_token_ids[tr.num_tokens_emitted:]
        if tr.metrics.first_token_time is None:
            tr.metrics.first_token_time = now
            self.stats.on_first_token(req, now)
        self.stats.on_tokens(req, len(new_ids), now)
        tr.metrics.last_token_time = now
        if tr.logprobs is not None:
            tr.logprobs.extend(lps[:len(new_ids)])
        if tr.detok is not None:
            visible = new_ids
            sp = req.sampling_params
            if (finished and req.status is RequestStatus.FINISHED_STOPPED and new_ids
                    and (new_ids[-1] in req.eos_token_ids or new_ids[-1] in sp.stop_token_ids)):
                visible = new_ids[:-1]  # the stop token itself is not text
            tr.text += tr.detok.add(visible)
            if finished:
                tr.text += tr.detok.finish()
            stop = self._find_stop(tr)
            if stop is not None and not finished:
                self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)
                finished = True
        if finished:
            tr.finish_reason = tr.finish_reason or req.status.finish_reason
            if tr.stop_reason is None:
                tr.stop_reason = req.stop_reason
            tr.metrics.finished_time = now
            self._forget(req.request_id)
            self.stats.on_finished(req, tr.finish_reason, tr.metrics)
        return self._output(tr, finished)

    def _find_stop(self, tr: _Track) -> str | None:
        sp = tr.request.sampling_params
        if not sp.stop:
            return None
        search_from = max(0, tr.emitted - tr.hold_back)
        best = None
        for s in sp.stop:
            i = tr.text.find(s, search_from)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        tr.text = tr.text[:i + len(s)] if sp.include_stop_str_in_output else tr.text[:i]
        tr.finish_reason, tr.stop_reason = "stop", s
        return s

    def _fail(self, tr: _Track, error: str | None, now: float) -> RequestOutput:
        """End one request with an error: its blocks are freed, its stream ends with ``error``."""
        req = tr.request
        tr.error = error or "the request failed"
        log.warning("request %s failed: %s", req.request_id, tr.error)
        self.scheduler.fail_request(req.request_id, tr.error)  # (a no-op if it already finished)
        tr.finish_reason, tr.stop_reason = "error", None
        tr.metrics.finished_time = now
        self._forget(req.request_id)
        self.stats.on_finished(req, "error", tr.metrics)
        return self._output(tr, finished=True)

    def _forget(self, request_id: str) -> _Track | None:
        """Drop a finished request's text state and grammar matcher."""
        if self._guided is not None:
            self._guided.remove(request_id)
        return self._tracks.pop(request_id, None)

    def _output(self, tr: _Track, finished: bool) -> RequestOutput:
        req = tr.request
        ids = req.output_token_ids
        emit_upto = len(tr.text) if finished else max(tr.emitted, len(tr.text) - tr.hold_back)
        delta = tr.text[tr.emitted:emit_upto]
        tr.emitted = emit_upto
        new_ids = ids[tr.num_tokens_emitted:]
        lp_delta = None
        if tr.logprobs is not None:
            lp_delta = tr.logprobs[tr.num_tokens_emitted:len(ids)]
        tr.num_tokens_emitted = len(ids)
        if finished:
            comp = CompletionOutput(0, tr.text, list(ids), tr.finish_reason, tr.stop_reason, tr.logprobs,
                                    delta, new_ids, lp_delta)
        else:  # deltas only: a copy of the whole sequence per step is quadratic for a queued stream
            comp = CompletionOutput(0, "", [], None, None, None, delta, new_ids, lp_delta)
        return RequestOutput(req.request_id, req.prompt_token_ids, [comp], finished, tr.prompt,
                             req.num_cached_tokens, tr.metrics, tr.error if finished else None)

    # ---- introspection ---------------------------------------------------------------
    def load_snapshot(self) -> dict[str, Any]:
        return load_snapshot(self.scheduler, self.kv, self.config.max_num_seqs, self.stats)
