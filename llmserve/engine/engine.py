"""The synchronous engine core: ``step()`` = schedule, run, update.

Everything stateful about one request's *text* (detokenisation, stop strings,
logprobs) lives here; token accounting lives in the scheduler, KV in the KV
manager, tensors in the runner.
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
from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from llmserve.engine.request import Request, RequestStatus, parse_priority
from llmserve.engine.runner import ModelRunner
from llmserve.engine.sampler import SampleRow, Sampler
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from llmserve.engine.scheduler import Scheduler, SchedulerConfig
from llmserve.engine.stats import EngineStats
from llmserve.models.config import ModelConfig
from llmserve.models.llama import LlamaForCausalLM

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
        factory = linear_factory_for(config.dtype, prepared_dir)
        self.model = LlamaForCausalLM(model_config, weights, factory)
        if isinstance(factory, PreparedCache):
            factory.save()
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        if config.kv_cache_dtype == "auto":
            config.kv_cache_dtype = "fp16" if config.dtype == "int8" else "fp32"
        kv_dtype = torch.float16 if config.kv_cache_dtype == "fp16" else torch.float32
        num_blocks = config.num_blocks_for(model_config.kv_bytes_per_token(kv_dtype.itemsize),
                                           self.max_model_len)
        self.max_model_len = min(self.max_model_len, num_blocks * config.block_size)
        self.kv = KVCacheManager(num_blocks, config.block_size,
                                 enable_prefix_caching=config.enable_prefix_caching,
                                 model_key=model_config.name)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            batch_min_share=config.batch_min_share,
            long_prefill_token_threshold=config.long_prefill_token_threshold), self.kv)
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
        if self._guided is None:
            if self.tokenizer is None:
                raise InvalidParameterError("structured_outputs", "needs an engine with a tokenizer")
            with self._guided_lock:  # one tokenizer info per engine (~0.4 s for 49k tokens)
                if self._guided is None:
                    from llmserve.engine.grammar import GrammarBackend

                    self._guided = GuidedDecoding(GrammarBackend(
                        self.tokenizer, self.model_config.vocab_size, sorted(self.eos_token_ids)))
        return self._guided.backend.compile(params.structured_outputs)

    def enqueue(self, req: Request, prompt_text: str | None = None) -> None:
        """Hand a prepared request to the scheduler (engine thread only)."""
        params = req.sampling_params
        self.scheduler.add_request(req)
        if req.grammar is not None:
            self._guided.add(req.request_id, req.grammar, req.output_token_ids)
        gen = None
        if params.seed is not None:
            gen = torch.Generator()
            gen.manual_seed(params.seed)
        detok = None
        if self.tokenizer is not None:
            detok = self.tokenizer.detokenizer(req.prompt_token_ids, params.skip_special_tokens)
        self._tracks[req.request_id] = _Track(
            req, detok, prompt_text, gen, RequestMetrics(req.arrival_time),
            logprobs=[] if params.logprobs is not None else None,
            hold_back=max((len(s) for s in params.stop), default=1) - 1)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Drop a request wherever it is; its KV blocks are freed at once."""
        req = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        tr = self._tracks.pop(request_id, None)
        if self._guided is not None:
            self._guided.remove(request_id)
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
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)
        plan = self.scheduler.schedule()
        if plan.empty:
            return []
        t0 = time.monotonic()
        for s in plan.scheduled:
            tr = self._tracks[s.request.request_id]
            if tr.metrics.first_scheduled_time is None:
                tr.metrics.first_scheduled_time = t0
                self.stats.on_first_scheduled(s.request, t0)
        guided = self._guided
        pending = guided.start(plan) if guided else None  # masks fill while the model runs
        run = self.runner.execute(plan)
        sampled, sampled_lp = self._sample(plan, run, GuidedDecoding.masks(pending))
        t1 = time.monotonic()
        self.stats.on_step(t0, t1, plan)
        complete = guided.commit(sampled) if guided else []
        finished = self.scheduler.update_from_output(plan, sampled)
        finished_ids = {r.request_id for r in finished}
        for rid in complete:  # the grammar ended (matters with ignore_eos; otherwise the stop token did)
            if rid not in finished_ids and self.scheduler.finish_request(rid, RequestStatus.FINISHED_STOPPED):
                finished_ids.add(rid)
        outputs = []
        for s in plan.scheduled:
            rid = s.request.request_id
            if rid not in sampled:
                continue
            tr = self._tracks.get(rid)
            if tr is None:
                continue
            outputs.append(self._advance(tr, sampled_lp.get(rid, []), t1, rid in finished_ids))
        return outputs

    def _sample(self, plan, run, masks: dict[str, torch.Tensor]
                ) -> tuple[dict[str, list[int]], dict[str, list[TokenLogprob]]]:
        sampled: dict[str, list[int]] = {}
        lps: dict[str, list[TokenLogprob]] = {}
        if self.spec is not None:
            return self.spec.verify(plan, run, self._row, masks)
        rows, order, idx = [], [], []
        for s in plan.scheduled:
            if s.sample:
                mask = masks.get(s.request.request_id)
                rows.append(self._row(s.request, allowed=None if mask is None else mask[0]))
                order.append(s.request.request_id)
                idx.append(run.rows[s.request.request_id][0])
        if not rows:
            return sampled, lps
        logits = run.logits
        if idx != list(range(logits.shape[0])):  # (advanced indexing costs ~50 us even for one row)
            logits = logits.index_select(0, torch.tensor(idx, dtype=torch.long))
        for rid, tok in zip(order, self.sampler.sample(logits, rows)):
            sampled[rid] = [tok.token_id]
            if tok.logprob is not None:
                lps[rid] = [TokenLogprob(tok.token_id, tok.logprob, tok.top_logprobs or [])]
        return sampled, lps

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
            self._tracks.pop(req.request_id, None)
            if self._guided is not None:
                self._guided.remove(req.request_id)
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
        comp = CompletionOutput(0, tr.text[:emit_upto], list(ids), tr.finish_reason if finished else None,
                                tr.stop_reason if finished else None, tr.logprobs, delta, new_ids, lp_delta)
        return RequestOutput(req.request_id, req.prompt_token_ids, [comp], finished, tr.prompt,
                             req.num_cached_tokens, tr.metrics)

    # ---- introspection ---------------------------------------------------------------
    def load_snapshot(self) -> dict[str, Any]:
        sch = self.scheduler
        by_prio: dict[str, int] = {}
        for r in sch.waiting:
            by_prio[str(r.priority)] = by_prio.get(str(r.priority), 0) + 1
        return {
            "num_running": len(sch.running),
            "num_waiting": len(sch.waiting),
            "num_waiting_by_priority": by_prio,
            "kv_cache_usage": self.kv.usage,
            "max_num_seqs": self.config.max_num_seqs,
            "prefix_cache_queries": self.kv.prefix_queries,
            "prefix_cache_hits": self.kv.prefix_hits,
            "num_preemptions": sch.num_preemptions,
            **self.stats.window(),
        }


class ContextLengthError(ValueError):
    """The prompt (plus max_tokens) does not fit the model's context."""

    def __init__(self, prompt_tokens: int, limit: int, max_tokens: int | None = None) -> None:
        if max_tokens is None:
            msg = (f"This model's maximum context length is {limit} tokens, but the prompt has "
                   f"{prompt_tokens} tokens (at least one token must be generated).")
        else:
            msg = (f"This model's maximum context length is {limit} tokens. However, you requested "
                   f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} "
                   f"for the completion). Please reduce the prompt or max_tokens.")
        super().__init__(msg)
        self.prompt_tokens = prompt_tokens
        self.limit = limit
