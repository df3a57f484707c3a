"""Lossless speculative decoding inside continuous batching.

Before each step a proposer guesses up to ``k`` next tokens for decoding requests;
the scheduler budgets them like any other tokens; the target model scores all of
them in the same forward pass as the rest of the batch; rejection sampling
(Leviathan et al., 2023) keeps exactly the target's distribution. The KV of
rejected positions is never counted as computed, so it is overwritten later and
never reaches the prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import time

import torch

from llmserve.engine.config import SpeculativeConfig
from llmserve.engine.kv_cache import KVGeometry
from llmserve.engine.outputs import TokenLogprob
from llmserve.engine.proposer import NgramProposer, Proposer
from llmserve.engine.request import Request
from llmserve.engine.sampler import (DEAD_END, NonFiniteError, RowFn, Sampler, StepSamples, constrain, draw, non_finite_rows,
                                     process)
from llmserve.engine.spec_policy import RATE_BUCKETS, Acceptance, draft_lengths
from llmserve.engine.step_cost import StepCosts

if TYPE_CHECKING:
    from llmserve.engine.guided import GuidedDecoding
    from llmserve.engine.runner import RunOutput
    from llmserve.engine.scheduler import ScheduledRequest, SchedulerOutput


def build_proposer(config: SpeculativeConfig, geometry: KVGeometry, vocab_size: int,
                   model_store: str | None = None) -> Proposer:
    """The proposer ``config.method`` names; a draft model is loaded from ``model_store``."""
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    from llmserve.engine.draft_model import DraftModelProposer

    return DraftModelProposer(config, geometry, vocab_size, model_store=model_store)


def rejection_sample(p_rows: list[torch.Tensor], drafts: list[int], q_rows: torch.Tensor | None,
                     greedy: bool, generator: torch.Generator | None) -> tuple[list[int], int]:
    """Accept a prefix of ``drafts`` and add one token; returns (tokens, number accepted).

    ``p_rows`` are the target's final distributions (penalised logits when greedy) at
    each draft position plus the bonus position. A draft token x is accepted with
    probability min(1, p(x)/q(x)); on rejection the replacement is drawn from
    normalise(max(p - q, 0)), which makes the output distribution exactly p.
    """
    out: list[int] = []
    for j, x in enumerate(drafts):
        p = p_rows[j]
        if greedy:
            t = int(p.argmax())
            if t == x:
                out.append(x)
                continue
            out.append(t)
            return out, j
        qx = 1.0 if q_rows is None else float(q_rows[j, x])
        u = float(torch.rand(1, generator=generator))
        if qx > 0 and u < min(1.0, float(p[x]) / qx):
            out.append(x)
            continue
        if q_rows is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = (p - q_rows[j]).clamp(min=0.0)
        total = float(residual.sum())
        out.append(draw(residual / total, generator) if total > 0 else draw(p, generator))
        return out, j
    bonus = p_rows[len(drafts)]
    out.append(int(bonus.argmax()) if greedy else draw(bonus, generator))
    return out, len(drafts)


@dataclass
class SpecCounters:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    # finished requests that drafted, by acceptance rate (cumulative per RATE_BUCKETS), and the rates' sum
    request_rate_buckets: list[int] = field(default_factory=lambda: [0] * len(RATE_BUCKETS))
    request_rate_sum: float = 0.0

    def record_request(self, proposed: int, accepted: int) -> None:
        rate = accepted / proposed
        self.request_rate_sum += rate
        for i, bound in enumerate(RATE_BUCKETS):
            if rate <= bound:
                self.request_rate_buckets[i] += 1


class SpeculativeDecoder:
    """Proposes before the step, verifies after the forward pass; owns the counters."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, *, max_model_len: int, rows: RowFn,
                 live_ids: Callable[[], Collection[str]], guided: Callable[[], GuidedDecoding | None],
                 generator: torch.Generator, costs: Callable[[], StepCosts] = StepCosts) -> None:
        """``rows`` builds a request's sampling rows; ``live_ids`` are the requests still unfinished
        (state of the others is dropped); ``guided`` gives the grammar matchers (None until the first
        structured-output request); ``generator`` is what unseeded requests draw from; ``costs``
        what a step costs on this machine (the engine's measured fit)."""
        self.config = config
        self.k = config.num_speculative_tokens
        self.k_max = config.max_speculative_tokens
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.rows = rows
        self.live_ids = live_ids
        self.guided = guided
        self.generator = generator
        self.costs = costs
        self.counters = SpecCounters(accepted_per_pos=[0] * self.k_max)
        self._accept: dict[str, Acceptance] = {}
        self._token_s = 0.0  # the proposer's seconds per draft token (EWMA)
        self._q: dict[str, torch.Tensor | None] = {}

    # vLLM-named counters, read by the metrics layer
    @property
    def num_drafts(self) -> int:
        return self.counters.num_drafts

    @property
    def num_draft_tokens(self) -> int:
        return self.counters.num_draft_tokens

    @property
    def num_accepted_tokens(self) -> int:
        return self.counters.num_accepted_tokens

    @property
    def accepted_per_pos(self) -> list[int]:
        return self.counters.accepted_per_pos

    def propose(self, running: list[Request]) -> None:
        live = set(self.live_ids())
        for rid in [r for r in self._accept if r not in live]:
            self.release(rid)
        decoding = [r for r in running if r.num_computed_tokens == r.num_tokens - 1]
        for r in running:
            r.spec_token_ids = []
        self._q.clear()
        # A seeded sampled request gets no drafts: its draws then depend on (seed, position)
        # only, so a stream resumed elsewhere from its tokens goes on exactly (resume.py).
        caps = [0 if _seeded(r) else min(self.k_max, r.max_tokens - r.num_output_tokens - 1,
                                         self.max_model_len - r.num_tokens - 1) for r in decoding]
        accs = [self._accept.setdefault(r.request_id, Acceptance()) for r in decoding]
        if self.config.adaptive:
            lengths = draft_lengths([a.rate for a in accs], caps, self.costs(), decoding=len(decoding),
                                    token_cost_s=self._token_s)
        else:
            lengths = [min(self.k, c) for c in caps]
        want = [(r, n) for r, n in zip(decoding, lengths) if n > 0]
        for acc, n in zip(accs, lengths):
            if n <= 0:
                acc.idle()  # back towards the prior: tried again later
        if not want:
            return
        t0 = time.perf_counter()
        props = self.proposer.propose([r for r, _ in want], max(n for _, n in want), self.rows)
        made = sum(len(p.tokens) for p in props.values())
        if made:
            self._token_s += 0.2 * ((time.perf_counter() - t0) / made - self._token_s)
        guided = self.guided()
        for r, room in want:
            prop = props.get(r.request_id)
            if prop and prop.tokens:
                tokens = prop.tokens[:room]
                if guided is not None:  # cut where the grammar refuses (guided.py says why this is exact)
                    tokens = guided.check_drafts(r.request_id, tokens, keep_refused=prop.q is not None)
                r.spec_token_ids = tokens
                self._q[r.request_id] = None if prop.q is None else prop.q[:len(tokens)]

    def release(self, request_id: str) -> None:
        """A request ended: count its acceptance, drop its state."""
        acc = self._accept.pop(request_id, None)
        if acc is not None and acc.proposed_total:
            self.counters.record_request(acc.proposed_total, acc.accepted_total)
        self.proposer.release(request_id)

    def verify(self, plan: SchedulerOutput, run: RunOutput,
               masks: dict[str, torch.Tensor] | None = None) -> StepSamples:
        """Rejection-sample every sampling request with draft tokens (the others are the plain
        sampler's: the same draws as without speculation); one whose rows cannot be sampled
        fails alone. ``masks[request_id][j]`` is the grammar's mask of that request's row j."""
        masks = masks or {}
        out = StepSamples()
        for s in plan.scheduled:
            if not s.sample or not s.spec_token_ids:
                continue
            rid = s.request.request_id
            start, n_rows = run.rows[rid]
            logits = run.logits[start:start + n_rows]
            try:
                if non_finite_rows(logits):  # (its rows only: most steps verify few requests)
                    raise NonFiniteError("the model's logits are not finite")
                out.tokens[rid], lps = self._verify_one(s, logits, masks.get(rid))
            except Exception as e:  # noqa: BLE001 - this request's own fault: the others go on
                out.failed[rid] = str(e) or type(e).__name__
                continue
            if lps is not None:
                out.logprobs[rid] = lps
        return out

    def _verify_one(self, s: ScheduledRequest, logits: torch.Tensor, mask: torch.Tensor | None) -> tuple[list[int], list[TokenLogprob] | None]:
        req = s.request
        drafts = s.spec_token_ids
        params = req.sampling_params
        raw_logits = logits
        base = self.rows(req, allowed=None if mask is None else mask[0])
        gen = base.generator or self.generator
        fast = params.greedy and not params.needs_penalties
        # base.banned (min_tokens): each draft position gets its own row, so an EOS drafted
        # before min_tokens is masked there and rejected, one after it kept, as without drafts
        if mask is not None or params.logit_bias or not fast or base.banned:
            rows = [base] + [self.rows(req, drafts[:j], None if mask is None else mask[j])
                             for j in range(1, len(logits))]
            logits = constrain(logits, rows)
        if fast:
            if logits is not raw_logits and non_finite_rows(logits):
                raise NonFiniteError(DEAD_END)
            p_rows = list(logits)  # argmax of the (constrained) logits: no per-row copy needed
        else:
            p_rows = [process(logits[j], rows[j]) for j in range(len(logits))]
        tokens, accepted = rejection_sample(p_rows, drafts, self._q.get(req.request_id), params.greedy, gen)
        if drafts:
            self._count(req, len(drafts), accepted)
        if params.logprobs is None:
            return tokens, None
        raw = torch.log_softmax(raw_logits.float(), dim=-1)
        return tokens, [TokenLogprob(t, d.logprob, d.top_logprobs or [])
                        for j, t in enumerate(tokens) for d in [Sampler.describe(t, base, raw[j])]]

    def _count(self, req: Request, proposed: int, accepted: int) -> None:
        c = self.counters
        c.num_drafts += 1
        c.num_draft_tokens += proposed
        c.num_accepted_tokens += accepted
        for i in range(accepted):
            c.accepted_per_pos[i] += 1
        self._accept.setdefault(req.request_id, Acceptance()).observe(proposed, accepted)


def _seeded(req: Request) -> bool:
    p = req.sampling_params
    return p.seed is not None and not p.greedy
