"""Grammar-guided decoding inside the batched step: one matcher per request,
next-token masks computed while the forward pass runs.

The order within a step is: ``check_drafts`` (before scheduling: a draft is cut
where the grammar refuses it), ``start`` (after scheduling: a worker thread fills
the masks of every sampling row, draft positions included, while the engine
thread runs the model; xgrammar releases the GIL), ``masks`` (joins it),
sampling with the masks applied, then ``commit`` (the accepted tokens advance
each matcher). Requests without a grammar cost nothing here. A matcher that
raises fails its own request only: its mask allows nothing, which the sampler
refuses to sample, or ``commit`` marks it failed.

Speculation stays exact. The mask of draft position ``j`` is the grammar's mask
after drafts ``0..j-1``, so each verified position samples from the constrained
target distribution, as plain decoding would. A draft token the grammar refuses
has target probability 0: it is rejected with certainty, so nothing after it can
be accepted. Drafts are cut right after it for a proposer with a draft
distribution (the rejection still draws from the residual ``max(p - q, 0)``,
which is what exactness needs), and right before it for a deterministic proposer
(n-gram: the residual is then ``p`` itself, the same as the plain bonus draw).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from llmserve.engine.grammar import GrammarBackend, Matcher
from llmserve.engine.reasoning_gate import AfterReasoning, first_phase, think_tokens
from llmserve.engine.sampler import StepSamples
from llmserve.engine.sampling_params import InvalidParameterError

if TYPE_CHECKING:
    from llmserve.engine.scheduler import SchedulerOutput

log = logging.getLogger(__name__)


class GuidedDecoding:
    """Owns the matchers of the requests that have a grammar."""

    def __init__(self, backend: GrammarBackend) -> None:
        self.backend = backend
        self._matchers: dict[str, Matcher] = {}
        self._pool: ThreadPoolExecutor | None = None  # started with the first grammar request

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._matchers

    def __len__(self) -> int:
        return len(self._matchers)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> "GuidedDecoding":
        if tokenizer is None:
            raise InvalidParameterError("structured_outputs", "needs an engine with a tokenizer")
        return cls(GrammarBackend(tokenizer, vocab_size, sorted(eos_token_ids)))

    def matcher(self, compiled: Any, output_ids: list[int] = (), *, after_reasoning: str | None = None,
                prompt_ids: list[int] = ()) -> Matcher:
        """A matcher of ``compiled`` after ``output_ids``; kept only once ``add`` is called
        (so that a request the scheduler refuses leaves nothing here). ``after_reasoning``:
        the grammar begins after the reasoning (``reasoning_gate``), as ``prompt_ids`` leave it."""
        m = self.backend.matcher(compiled)
        tags = think_tokens(self.backend.tokenizer) if after_reasoning is not None else None
        if tags is not None:
            m = AfterReasoning(m, first_phase(after_reasoning, *tags, prompt_ids), *tags)
        for t in output_ids:
            m.accept_token(t)
        return m

    def add(self, request_id: str, matcher: Matcher) -> None:
        self._matchers[request_id] = matcher

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def check_drafts(self, request_id: str, drafts: list[int], keep_refused: bool) -> list[int]:
        """The drafts worth verifying: up to the first one the grammar refuses
        (that one included when ``keep_refused``; see the module docstring)."""
        m = self._matchers.get(request_id)
        if m is None or not drafts:
            return drafts
        n = 0
        while n < len(drafts) and m.accept_token(drafts[n]):
            n += 1
        if n:
            m.rollback(n)
        return drafts[:n + 1] if keep_refused and n < len(drafts) else drafts[:n]

    def start(self, plan: "SchedulerOutput") -> Future | None:
        """Fill, in the worker thread, the masks of this step's sampling rows that have a grammar."""
        work = [(s.request.request_id, s.spec_token_ids) for s in plan.scheduled
                if s.sample and s.request.request_id in self._matchers]
        if not work:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="llmserve-grammar")
        return self._pool.submit(self._fill, work)

    def _fill(self, work: list[tuple[str, list[int]]]) -> dict[str, torch.Tensor]:
        out = {}
        for rid, drafts in work:
            mask = self.backend.allocate(1 + len(drafts))
            try:
                self._fill_one(self._matchers[rid], drafts, mask)
            except Exception:  # noqa: BLE001 - a mask that allows nothing fails this request alone, in sampling
                log.exception("grammar mask of request %s failed", rid)
                mask.zero_()
            out[rid] = mask
        return out

    @staticmethod
    def _fill_one(m: Matcher, drafts: list[int], mask: torch.Tensor) -> None:
        m.fill_next_token_bitmask(mask, 0)
        n = 0
        for j, t in enumerate(drafts):  # position j + 1 follows drafts[0..j]
            if not m.accept_token(t):
                break  # refused: never accepted, so later positions are never sampled
            n += 1
            if m.is_terminated():
                break  # a stop token ended the match: the sequence ends there, and a terminated
                # matcher allows no token at all (its mask would make the row's distribution empty)
            m.fill_next_token_bitmask(mask, j + 1)
        if n:
            m.rollback(n)

    @staticmethod
    def masks(pending: Future | None) -> dict[str, torch.Tensor]:
        return pending.result() if pending is not None else {}

    def commit(self, samples: StepSamples) -> list[str]:
        """Advance the matchers by the tokens each request produced; returns the requests
        whose grammar is now complete (a stop token ended it). Requests that failed are
        skipped; one whose matcher raises joins ``samples.failed``."""
        done = []
        for rid, tokens in list(samples.tokens.items()):
            m = self._matchers.get(rid)
            if m is None or rid in samples.failed:
                continue
            try:
                if not all(m.accept_token(t) and not m.is_terminated() for t in tokens):
                    # Masked sampling only draws allowed tokens; a refusal here means
                    # the grammar has ended (a stop token came after completion).
                    done.append(rid)
            except Exception as e:  # noqa: BLE001 - this request's grammar only
                samples.failed[rid] = f"grammar: {e}"
                del samples.tokens[rid]
        return done

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
