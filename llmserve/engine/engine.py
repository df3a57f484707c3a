"""The synchronous engine core: ``step()`` = schedule, execute, sample, update, process.

Each part has one owner: token accounting the scheduler, KV the KV manager,
tensors the runner, seeded generators the row builder, grammar matchers guided
decoding, and a request's *text* (detokenisation, stop strings, logprobs,
metrics) the output processor. The engine passes data between them.

One bad request never hurts another: a request whose scheduling, sampling or text
raises is failed alone (its final output has ``finish_reason == "error"`` and
``error`` set, its KV blocks are freed) and the step goes on without it. Only a
fault of the whole batch, the forward pass itself, makes ``step()`` raise.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch

from llmserve.engine.config import EngineConfig
from llmserve.engine.guided import GuidedDecoding
from llmserve.engine.input_processor import InputProcessor
from llmserve.engine.kv_budget import available_memory
from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.output_processor import Ended, OutputProcessor
from llmserve.engine.outputs import RequestOutput, TokenLogprob
from llmserve.engine.request import Request, RequestStatus
from llmserve.engine.resume import prime
from llmserve.engine.runner import ModelRunner
from llmserve.engine.sampler import RowBuilder, Sampler, StepSamples
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.scheduler import Scheduler, SchedulerConfig
from llmserve.engine.stats import EngineStats, load_snapshot
from llmserve.models import outliers
from llmserve.models.config import ModelConfig
from llmserve.models.errors import FlagError
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.quant import round_activations

log = logging.getLogger(__name__)


def _refuse_int8_shape(config: EngineConfig, mc: ModelConfig) -> None:
    """int8 weights are quantised in groups along a layer's input: a model whose widths are
    not a multiple of the group is refused by its flag, before any layer is built."""
    from llmserve.models.qlayout import GROUP

    widths = {mc.hidden_size, mc.intermediate_size, mc.num_attention_heads * mc.head_dim}
    if config.dtype == "int8" and (odd := sorted(w for w in widths if w % GROUP)):
        raise FlagError(f"--dtype: int8 needs the model's layer widths to be multiples of {GROUP}, "
                        f"this model has {odd[0]}: use --dtype fp32, bf16 or w8a8")


class EngineCore:
    """One model, one KV pool, one scheduler; not thread-safe (its client serialises)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig,
                 weights: dict[str, torch.Tensor], tokenizer: Any | None = None,
                 prepared_dir: Path | None = None) -> None:
        """``prepared_dir``: where the model store keeps prepared (int8) weights, if anywhere."""
        self.model_config = model_config
        self.tokenizer = tokenizer
        if config.threads:
            torch.set_num_threads(config.threads)
        from llmserve.models.weights import PreparedCache, linear_factory_for, resolve_dtype

        # "auto" resolved once, here, where the weights' source is known; the config stays frozen.
        dtype = resolve_dtype(config.dtype, model_config.quantized_source)
        kv_cache_dtype = config.kv_cache_dtype
        if kv_cache_dtype == "auto":
            kv_cache_dtype = "fp16" if dtype == "int8" else "fp32"
        self.config = config = config.model_copy(update={"dtype": dtype, "kv_cache_dtype": kv_cache_dtype})
        _refuse_int8_shape(config, model_config)
        keep_fp32 = config.exact_activations or config.prefill_weights == "fp32"
        factory = linear_factory_for(config.dtype, prepared_dir, exact=keep_fp32,
                                     unpack=config.prefill_weights in ("unpack", "auto"))
        self.model = LlamaForCausalLM(model_config, weights, factory)
        if not config.exact_activations:  # one byte where quality holds (int8 layers only)
            round_activations(self.model)
            if tokenizer is not None:  # and on the rest, less their outlier channels
                outliers.split(self.model, outliers.calibration_ids(tokenizer))
        if config.prefill_weights == "auto":  # resolved once, after the layers' rounding is set
            from llmserve.models import prefill_path

            chosen = prefill_path.choose(self.model) or ("fp32" if keep_fp32 else "unpack")
            self.config = config = config.model_copy(update={"prefill_weights": chosen})
        if isinstance(factory, PreparedCache):
            factory.save()
        from llmserve.engine.lora.ops import build_lora

        self.lora = build_lora(config, model_config, self.model)  # (after the base's own set-up)
        asked, most = config.max_model_len, model_config.max_position_embeddings
        if asked and asked > most:  # (as vLLM: a length the model was not made for is refused, not cut)
            raise FlagError(f"--max-model-len: {asked} is longer than the model's context ({most} tokens)")
        self.max_model_len = asked or most
        kv_dtype = torch.float16 if config.kv_cache_dtype == "fp16" else torch.float32
        # a block is a page of group_size layers; a short request takes one per KV group
        layout = self.model.kv_layout
        num_blocks = config.num_blocks_for(
            model_config.kv_bytes_per_token(kv_dtype.itemsize) * layout.group_size // model_config.num_hidden_layers,
            self.max_model_len * layout.num_groups, available_memory())
        spec_tokens = config.speculative_config.max_speculative_tokens if config.speculative_config else 0
        self.kv = KVCacheManager(num_blocks, config.block_size,
                                 enable_prefix_caching=config.enable_prefix_caching,
                                 model_key=model_config.name, windows=layout.windows,
                                 step_tokens=config.max_num_batched_tokens + spec_tokens)
        # a draft model's pool mirrors this one's without freeing: it bounds the length then
        draft = config.speculative_config is not None and config.speculative_config.method == "draft"
        fits = num_blocks * config.block_size if draft else self.kv.token_capacity
        if asked and asked > fits:
            raise FlagError(f"--max-model-len: {asked} does not fit the KV cache, which holds {fits} tokens of a "
                             "request: give it more memory (--kv-cache-memory, --num-kv-blocks) or a shorter "
                             "--max-model-len")
        self.max_model_len = min(self.max_model_len, fits)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            batch_min_share=config.batch_min_share,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            step_budget_tokens=config.step_budget_tokens, step_time_budget_s=config.step_time_budget_s,
            max_loras=config.max_loras if self.lora is not None else 0), self.kv)
        self.runner = ModelRunner(self.model, self.kv, kv_dtype, self.lora)
        self.sampler = Sampler(config.seed)
        self.rows = RowBuilder()
        self.stats = EngineStats()
        self.output = OutputProcessor(tokenizer, self.stats)
        self.eos_token_ids = frozenset(model_config.eos_token_id or [])
        if tokenizer is not None:
            self.eos_token_ids |= frozenset(getattr(tokenizer, "eos_token_ids", []) or [])
        self.inputs = InputProcessor(tokenizer, model_config.vocab_size, self.max_model_len, self.eos_token_ids,
                                     self.compile_grammar)
        self._threads_wanted: int | None = None  # set_threads: applied before the next step
        self._guided: GuidedDecoding | None = None  # built while the instance warms up (warm_grammar)
        self._guided_lock = threading.Lock()
        self.spec = None
        if (sc := config.speculative_config) is not None:
            from llmserve.engine.spec_decode import SpeculativeDecoder, build_proposer

            proposer = build_proposer(sc, self.kv.geometry, model_config.vocab_size, config.model_store)
            self.spec = SpeculativeDecoder(sc, proposer, max_model_len=self.max_model_len, rows=self.rows.row,
                                           live_ids=self.scheduler.requests.keys, guided=lambda: self._guided,
                                           generator=self.sampler.generator, costs=self.stats.step_costs)

    # ---- requests --------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    *, priority: int | str | None = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None, resume_token_ids: list[int] | None = None,
                    lora_name: str | None = None) -> Request:
        """Validate and queue; raises ``ValueError`` (or ``InvalidParameterError``) on bad input.
        ``lora_name``: the adapter it runs with (None: the base model)."""
        req, prompt_text = self.inputs.process(request_id, prompt, params, priority=priority, cache_salt=cache_salt,
                                               arrival_time=arrival_time, resume_token_ids=resume_token_ids,
                                               lora_name=lora_name)
        self.enqueue(req, prompt_text)
        return req

    @property
    def guided(self) -> GuidedDecoding | None:
        """Grammar matchers of structured-output requests; None until the first one."""
        return self._guided

    def compile_grammar(self, params: SamplingParams):
        """The compiled grammar of ``params.structured_outputs`` (None without one); safe from any
        thread and cached, so a server compiles in a worker thread before ``add_request``."""
        if params.structured_outputs is None:
            return None
        return self.warm_grammar().backend.compile(params.structured_outputs)

    def warm_grammar(self) -> GuidedDecoding | None:
        """Build the tokenizer's grammar info now (~0.4 s for 49k tokens), so no request
        pays it on the step loop; an instance calls this while it warms up."""
        if self.tokenizer is None:
            return None
        with self._guided_lock:  # one tokenizer info per engine
            if self._guided is None:
                self._guided = GuidedDecoding.for_tokenizer(self.tokenizer, self.model_config.vocab_size,
                                                            self.eos_token_ids)
        return self._guided

    def enqueue(self, req: Request, prompt_text: str | None = None) -> None:
        """Hand a prepared request to the scheduler (engine thread only).

        All or nothing: whatever raises here leaves no trace of the request.
        """
        req.rope_offset = self.model.rope.offset_for(len(req.prompt_token_ids))
        if req.lora_name is not None:
            from llmserve.engine.lora.ops import need

            req.lora_id = need(self.lora).acquire(req.request_id, req.lora_name)
        try:
            state = self.output.new_state(req, prompt_text)
            so = req.sampling_params.structured_outputs
            matcher = self._guided.matcher(req.grammar, req.output_token_ids, prompt_ids=req.prompt_token_ids,
                                           after_reasoning=so.after_reasoning) if req.grammar is not None else None
            prime(state, req.output_token_ids)  # (a resumed stream's; none otherwise)
            self.scheduler.add_request(req)
        except BaseException:
            if self.lora is not None:
                self.lora.release(req.request_id)
            raise
        self.output.add(state)
        self.rows.add(req)
        if matcher is not None:
            self._guided.add(req.request_id, matcher)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Drop a request wherever it is; its KV blocks are freed at once."""
        req = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        self._forget(request_id)
        if req is None:
            self.output.drop(request_id)
            return None
        return self.output.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- the step ----------------------------------------------------------------------
    def set_threads(self, n: int) -> None:
        """Run the next steps on ``n`` torch threads: ``llmserve serve`` shares a machine's
        cores out over the instances it runs, as they come and go. Applied between steps
        (the call may come from another thread)."""
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        self._threads_wanted = n

    def step(self) -> list[RequestOutput]:
        """Schedule, execute, sample, update, process; raises only when the forward pass itself fails."""
        if self._threads_wanted is not None:
            torch.set_num_threads(self._threads_wanted)
            self._threads_wanted = None
        self._propose()
        plan = self.scheduler.schedule(self.stats.step_costs())  # chunks sized by measured step time
        t0 = time.monotonic()
        outputs = [o for r in plan.failed if (o := self.output.fail(r.request_id, r.error, t0))]
        if not plan.empty:
            self.output.on_scheduled(plan, t0)
            pending = self._guided.start(plan) if self._guided else None  # masks fill while the model runs
            run = self.runner.execute(plan)
            samples = self._sample(plan, run, GuidedDecoding.masks(pending))
            finished, t1 = self._update(plan, samples, t0)
            self._end(self.output.process(plan, samples, finished, t1, outputs))
        for o in outputs:
            if o.finished:
                self._forget(o.request_id)
        return outputs

    def _update(self, plan, samples: StepSamples, t0: float) -> tuple[set[str], float]:
        """Apply the samples to the matchers and the scheduler; returns the requests they
        finished and when the step's work ended."""
        complete = self._guided.commit(samples) if self._guided else []  # (skips, or adds to, samples.failed)
        for rid, why in samples.failed.items():
            self.scheduler.fail_request(rid, f"sampling failed: {why}")
        t1 = time.monotonic()
        self.stats.on_step(t0, t1, plan)
        finished = {r.request_id for r in self.scheduler.update_from_output(plan, samples.tokens)}
        for rid in complete:  # the grammar ended (matters with ignore_eos; otherwise the stop token did)
            if rid not in finished and self.scheduler.finish_request(rid, RequestStatus.FINISHED_STOPPED):
                finished.add(rid)
        return finished, t1

    def _end(self, ended: Ended) -> None:
        """Tell the scheduler about the requests the output processor ended."""
        for rid, error in ended.items():
            if error is None:
                self.scheduler.finish_request(rid, RequestStatus.FINISHED_STOPPED)
            else:
                self.scheduler.fail_request(rid, error)

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
        # drafts are verified by the speculative decoder, every other row sampled here
        out = self.spec.verify(plan, run, masks) if self.spec is not None else StepSamples()
        rows, order, idx = [], [], []
        for s in plan.scheduled:
            if s.sample and not s.spec_token_ids:
                mask = masks.get(s.request.request_id)
                rows.append(self.rows.row(s.request, allowed=None if mask is None else mask[0]))
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

    def _forget(self, request_id: str) -> None:
        """Drop a finished request's generator, grammar matcher and speculation state."""
        self.rows.remove(request_id)
        if self.lora is not None:
            self.lora.release(request_id)
        if self.spec is not None:
            self.spec.release(request_id)
        if self._guided is not None:
            self._guided.remove(request_id)

    # ---- introspection ---------------------------------------------------------------
    def load_snapshot(self) -> dict[str, Any]:
        from llmserve.engine.lora.ops import lora_state

        lora = lora_state(self.lora)
        return {**load_snapshot(self.scheduler, self.kv, self.config.max_num_seqs, self.stats),
                "threads": self._threads_wanted or torch.get_num_threads(),
                "lora_adapters": lora["resident"],
                "lora_adapters_loaded": [n for n in lora["loaded"] if n not in lora["resident"]],
                "lora_adapters_registered": sorted(lora["adapters"])}
