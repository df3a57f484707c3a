"""Draft-model proposer: a smaller model with the same tokenizer runs ahead ``k`` tokens.

The draft keeps its own paged KV pool, block accounting and runner, driven by
shadow requests that mirror the target's tokens. After the target verifies, the
draft's computed length is cut back to the longest prefix it shares with the
target's accepted tokens, so a rejected guess is simply recomputed next time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmserve.engine.config import SpeculativeConfig
from llmserve.engine.kv_cache import KVCacheManager, KVGeometry
from llmserve.engine.proposer import Proposal
from llmserve.engine.request import Request
from llmserve.engine.runner import ModelRunner
from llmserve.engine.sampler import RowFn, draw, process
from llmserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from llmserve.models.llama import LlamaForCausalLM


@dataclass
class _Shadow:
    request: Request  # the draft's own view: tokens it has KV for, plus drafts
    computed: list[int]  # tokens whose KV the draft holds, in order


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelProposer:
    """``geometry``: the target's KV pool, which the draft's own pool mirrors (so it holds every
    request the target does); ``vocab_size``: the target's, which the draft must share."""

    def __init__(self, config: SpeculativeConfig, geometry: KVGeometry, vocab_size: int, *,
                 model_store: str | None = None, model: LlamaForCausalLM | None = None) -> None:
        if model is None:
            model = _load_draft(config, model_store)
        if model.config.vocab_size != vocab_size:
            from llmserve.models.errors import FlagError

            raise FlagError(f"--speculative-config: the draft model's vocab {model.config.vocab_size} differs "
                            f"from the target's {vocab_size}: they must share a tokenizer")
        self.kv = KVCacheManager(geometry.num_blocks, geometry.block_size, enable_prefix_caching=False,
                                 watermark=0.0)
        self.runner = ModelRunner(model, self.kv)
        self.shadows: dict[str, _Shadow] = {}

    def release(self, request_id: str) -> None:
        sh = self.shadows.pop(request_id, None)
        if sh is not None:
            self.kv.free(sh.request)

    def propose(self, requests: list[Request], k: int, rows: RowFn) -> dict[str, Proposal]:
        active: list[tuple[Request, _Shadow]] = []
        for r in requests:
            sh = self.shadows.get(r.request_id)
            if sh is None:
                shadow = Request(r.request_id, r.prompt_token_ids, r.sampling_params, r.max_tokens)
                shadow.rope_offset = self.runner.model.rope.offset_for(len(r.prompt_token_ids))  # (its own rope)
                sh = self.shadows[r.request_id] = _Shadow(shadow, [])
            target = r.all_token_ids
            keep = min(_common_prefix(sh.computed, target), len(target) - 1)
            sh.computed = target[:keep]
            sh.request.all_token_ids = list(target)
            sh.request.num_computed_tokens = keep
            self.kv.trim(sh.request, keep)
            if not self.kv.allocate_slots(sh.request, len(target) - keep + k):
                self.release(r.request_id)  # draft pool full: no guess this time
                continue
            active.append((r, sh))
        tokens: dict[str, list[int]] = {r.request_id: [] for r, _ in active}
        qs: dict[str, list[torch.Tensor]] = {r.request_id: [] for r, _ in active}
        for step in range(k):
            plan = SchedulerOutput()
            for r, sh in active:
                n = sh.request.num_tokens - sh.request.num_computed_tokens
                plan.scheduled.append(ScheduledRequest(sh.request, n, [], True))
            if not plan.scheduled:
                break
            run = self.runner.execute(plan)
            for r, sh in list(active):
                start, _ = run.rows[r.request_id]
                row = rows(r, tokens[r.request_id])
                try:
                    dist = process(run.logits[start], row)
                    if r.sampling_params.greedy:
                        t = int(dist.argmax())
                        q = torch.zeros_like(dist)
                        q[t] = 1.0
                    else:
                        t = draw(dist, row.generator)
                        q = dist
                except Exception:  # noqa: BLE001 - a row the draft cannot sample just stops guessing
                    active.remove((r, sh))
                    continue
                tokens[r.request_id].append(t)
                qs[r.request_id].append(q)
                shr = sh.request
                sh.computed = shr.all_token_ids[:shr.num_tokens]
                shr.num_computed_tokens = shr.num_tokens
                shr.all_token_ids.append(t)
        return {rid: Proposal(t, torch.stack(qs[rid])) for rid, t in tokens.items() if t}


def _load_draft(config: SpeculativeConfig, model_store: str | None) -> LlamaForCausalLM:
    from llmserve.models.model_source import load_weights
    from llmserve.models.store import locate
    from llmserve.models.weights import linear_factory_for

    source, store = locate(str(config.model), model_store)
    mc, weights = load_weights(source, store)
    return LlamaForCausalLM(mc, weights, linear_factory_for("fp32"))
