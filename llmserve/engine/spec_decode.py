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

import torch

from llmserve.engine.config import SpeculativeConfig
from llmserve.engine.kv_cache import KVGeometry
from llmserve.engine.outputs import TokenLogprob
from llmserve.engine.proposer import NgramProposer, Proposer
from llmserve.engine.request import Request
from llmserve.engine.sampler import (NonFiniteError, RowFn, Sampler, StepSamples, constrain, draw, non_finite_rows,
                                     process)

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
class _Acceptance:
    k: int  # this request's current draft length
    rate: float = 1.0  # EWMA of accepted / proposed
    paused_until: int = 0  # output length at which to try speculating again

    def adapt(self, proposed: int, accepted: int, k_max: int) -> None:
        """Grow after a draft accepted whole at full length; shrink to what was accepted."""
        if accepted == proposed == self.k:
            self.k = min(k_max, self.k + 2)
        elif accepted < proposed:
            self.k = max(1, accepted + 1)


@dataclass
class SpecCounters:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class SpeculativeDecoder:
    """Proposes before the step, verifies after the forward pass; owns the counters."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, *, max_model_len: int, rows: RowFn,
                 live_ids: Callable[[], Collection[str]], guided: Callable[[], GuidedDecoding | None],
                 generator: torch.Generator) -> None:
        """``rows`` builds a request's sampling rows; ``live_ids`` are the requests still unfinished
        (state of the others is dropped); ``guided`` gives the grammar matchers (None until the first
        structured-output request); ``generator`` is what unseeded requests draw from."""
        self.config = config
        self.k = config.num_speculative_tokens
        self.k_max = config.max_speculative_tokens
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.rows = rows
        self.live_ids = live_ids
        self.guided = guided
        self.generator = generator
        self.counters = SpecCounters(accepted_per_pos=[0] * self.k_max)
        self._accept: dict[str, _Acceptance] = {}
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
            self._accept.pop(rid, None)
            self.proposer.release(rid)
        decoding = [r for r in running if r.num_computed_tokens == r.num_tokens - 1]
        for r in running:
            r.spec_token_ids = []
        self._q.clear()
        # A large batch is compute-bound already: extra positions would cost, not save.
        if len(decoding) > self.config.max_batch_for_spec:
            return
        want = []
        for r in decoding:
            acc = self._accept.setdefault(r.request_id, _Acceptance(self.k))
            if acc.paused_until > r.num_output_tokens:
                continue
            room = min(acc.k, r.max_tokens - r.num_output_tokens - 1,
                       self.max_model_len - r.num_tokens - 1)
            if room > 0:
                want.append((r, room))
        if not want:
            return
        props = self.proposer.propose([r for r, _ in want], max(room for _, room in want), self.rows)
        guided = self.guided()
        for r, room in want:
            prop = props.get(r.request_id)
            if prop and prop.tokens:
                tokens = prop.tokens[:room]
                if guided is not None:  # cut where the grammar refuses (guided.py says why this is exact)
                    tokens = guided.check_drafts(r.request_id, tokens, keep_refused=prop.q is not None)
                r.spec_token_ids = tokens
                self._q[r.request_id] = None if prop.q is None else prop.q[:len(tokens)]

    def verify(self, plan: SchedulerOutput, run: RunOutput,
               masks: dict[str, torch.Tensor] | None = None) -> StepSamples:
        """Rejection-sample every sampling request; one whose rows cannot be sampled fails alone.
        ``masks[request_id][j]`` is the grammar's mask of that request's row j."""
        masks = masks or {}
        out = StepSamples()
        decoding = sum(1 for s in plan.scheduled if s.sample)
        required = self.config.min_acceptance + self.config.acceptance_slope * max(0, decoding - 1)
        bad_rows = non_finite_rows(run.logits)  # one reduction when every row is fine
        for s in plan.scheduled:
            if not s.sample:
                continue
            rid = s.request.request_id
            start, n_rows = run.rows[rid]
            try:
                if bad_rows and any(start <= j < start + n_rows for j in bad_rows):
                    raise NonFiniteError("the model's logits are not finite")
                out.tokens[rid], lps = self._verify_one(s, run.logits[start:start + n_rows], required,
                                                        masks.get(rid))
            except Exception as e:  # noqa: BLE001 - this request's own fault: the others go on
                out.failed[rid] = str(e) or type(e).__name__
                continue
            if lps is not None:
                out.logprobs[rid] = lps
        return out

    def _verify_one(self, s: ScheduledRequest, logits: torch.Tensor, required: float,
                    mask: torch.Tensor | None) -> tuple[list[int], list[TokenLogprob] | None]:
        req = s.request
        drafts = s.spec_token_ids
        params = req.sampling_params
        raw_logits = logits
        base = self.rows(req, allowed=None if mask is None else mask[0])
        gen = base.generator or self.generator
        fast = params.greedy and not params.needs_penalties
        if mask is not None or params.logit_bias or not fast:
            rows = [base] + [self.rows(req, drafts[:j], None if mask is None else mask[j])
                             for j in range(1, len(logits))]
            logits = constrain(logits, rows)
        if fast:
            if logits is not raw_logits and non_finite_rows(logits):
                raise NonFiniteError("the constrained logits are not finite (the grammar allowed no token)")
            p_rows = list(logits)  # argmax of the (constrained) logits: no per-row copy needed
        else:
            p_rows = [process(logits[j], rows[j]) for j in range(len(logits))]
        tokens, accepted = rejection_sample(p_rows, drafts, self._q.get(req.request_id), params.greedy, gen)
        if drafts:
            self._count(req, len(drafts), accepted, required)
        if params.logprobs is None:
            return tokens, None
        raw = torch.log_softmax(raw_logits.float(), dim=-1)
        return tokens, [TokenLogprob(t, d.logprob, d.top_logprobs or [])
                        for j, t in enumerate(tokens) for d in [Sampler.describe(t, base, raw[j])]]

    def _count(self, req: Request, proposed: int, accepted: int, required: float) -> None:
        c = self.counters
        c.num_drafts += 1
        c.num_draft_tokens += proposed
        c.num_accepted_tokens += accepted
        for i in range(accepted):
            c.accepted_per_pos[i] += 1
        acc = self._accept.setdefault(req.request_id, _Acceptance(self.k))
        acc.rate = 0.7 * acc.rate + 0.3 * (accepted / proposed)
        acc.adapt(proposed, accepted, self.k_max)
        if acc.rate < required:
            # Not paying for itself: pause, then probe again later.
            acc.paused_until = req.num_output_tokens + 32
            acc.rate = required + 0.1
