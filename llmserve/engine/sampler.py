"""Turn logits into tokens: grammar masks, logit bias, penalties, temperature,
top-k / top-p / min-p, seeds, logprobs.

``constrain`` applies what is batched (a grammar's allowed tokens, ``logit_bias``)
to all rows at once; ``process`` then produces the distribution a row actually
samples from. Speculative decoding's rejection sampler reuses both, so that
speculation changes nothing about what is sampled. Logprobs are the model's own
(before any of this), as vLLM reports them by default.

A row whose logits or distribution are not finite (NaN, inf, no mass left, or a
grammar that allowed nothing) is not sampled: its token carries an ``error`` and
only its request fails. The check costs one reduction over the whole batch when
every row is fine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from llmserve.engine.outputs import TokenLogprob
from llmserve.engine.resume import position_seed
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.ops import layer_ops

if TYPE_CHECKING:
    from llmserve.engine.request import Request


@dataclass(slots=True)
class SampleRow:
    """What the sampler needs to know about one row of logits."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]  # tokens generated so far (before this row's position)
    generator: torch.Generator | None
    # The grammar's allowed next tokens, a packed int32 bitmask row (engine/grammar.py); None: any.
    allowed: torch.Tensor | None = None
    # Tokens this row may not produce (EOS and stop_token_ids before min_tokens); None: none.
    banned: list[int] | None = None


class RowFn(Protocol):
    """The row of ``req`` at the position after its output plus ``extra_output`` (draft tokens)."""

    def __call__(self, req: "Request", extra_output: list[int] | None = None,
                 allowed: torch.Tensor | None = None) -> SampleRow: ...


class RowBuilder:
    """Owns each seeded request's generator and builds its rows (a ``RowFn``).

    A seeded request draws from its own generator, so its tokens do not depend on
    what else shares the batch; the others share the sampler's.
    """

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def add(self, req: "Request") -> None:
        seed = req.sampling_params.seed
        if seed is not None:
            self._generators[req.request_id] = torch.Generator().manual_seed(seed)

    def remove(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def row(self, req: "Request", extra_output: list[int] | None = None,
            allowed: torch.Tensor | None = None) -> SampleRow:
        out = req.output_token_ids + (extra_output or [])
        sp = req.sampling_params
        # vLLM's min_tokens: no stop token until the output is that long. EOS is banned even with
        # ignore_eos, as vLLM's does. A position's own count, so each draft position gets its own.
        banned = sorted(req.eos_token_ids | set(sp.stop_token_ids)) if len(out) < sp.min_tokens else None
        return SampleRow(sp, req.prompt_token_ids, out, self._generators.get(req.request_id), allowed, banned)


@dataclass(slots=True)
class SampledToken:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    error: str | None = None  # set: this row could not be sampled (``token_id`` is meaningless)


@dataclass(slots=True)
class StepSamples:
    """What one step sampled, by request id: the accepted drafts plus one new token each,
    their logprobs when asked for, and why a request could not be sampled."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class NonFiniteError(ValueError):
    """A row's logits or sampling distribution hold NaN or inf, or no probability mass."""


# A row whose grammar allows no token at all (the output so far cannot be continued):
# the request's own constraint, its 400 (server/engine_errors.py reads this text).
DEAD_END = "the output constraint allows no token here (it cannot be continued)"


def non_finite_rows(logits: torch.Tensor, argmax: torch.Tensor | None = None) -> list[int]:
    """Rows of ``logits`` that cannot be sampled: holding NaN or +inf, or nothing above
    -inf. A row's max (which propagates NaN) is finite exactly when the row is fine, so
    this is one reduction; a -inf alone is a banned token (a grammar mask), not a fault.
    Given the rows' ``argmax`` (NaN first, as torch's), the max is read there: no pass.
    """
    top = logits.gather(1, argmax.view(-1, 1)).view(-1) if argmax is not None else logits.amax(dim=-1)
    if bool(torch.isfinite(top).all()):
        return []
    return (~torch.isfinite(top)).nonzero().flatten().tolist()


def constrain(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """``logits`` with each row's grammar mask, logit bias and banned tokens applied (a copy;
    the same tensor if none)."""
    # one pass over the batch when no row asks for any of them (the usual step)
    special = [i for i, r in enumerate(rows) if r.allowed is not None or r.params.logit_bias or r.banned]
    if not special:
        return logits
    masked = [i for i in special if rows[i].allowed is not None]
    biased = [i for i in special if rows[i].params.logit_bias]
    logits = logits.float().clone()
    if biased:
        ri, ti, vi = [], [], []
        for i in biased:
            bias = rows[i].params.logit_bias
            ri += [i] * len(bias)
            ti += bias.keys()
            vi += bias.values()
        logits.index_put_((torch.tensor(ri), torch.tensor(ti)), torch.tensor(vi, dtype=logits.dtype),
                          accumulate=True)
    if masked:
        from llmserve.engine.grammar import apply_bitmask

        apply_bitmask(logits, torch.stack([rows[i].allowed for i in masked]), masked)
    v = logits.shape[-1]  # (a stop_token_id past the vocabulary can never be produced anyway)
    banned = [(i, t) for i in special for t in rows[i].banned or () if t < v]
    if banned:
        ri, ti = list(zip(*banned))
        kept = logits[list(ri), list(ti)]
        logits[list(ri), list(ti)] = float("-inf")
        # A complete structured output allows only EOS: the constraint wins over min_tokens
        # (the answer ends valid, as without it), where banning would leave no token at all.
        for i in {i for i in ri if rows[i].allowed is not None}:
            if not torch.isfinite(logits[i]).any():
                at = [j for j, r in enumerate(ri) if r == i]
                logits[i, [ti[j] for j in at]] = kept[at]
    return logits


def apply_penalties(logits: torch.Tensor, row: SampleRow) -> torch.Tensor:
    """Repetition (prompt + output, HF's rule), presence and frequency (output only, OpenAI's)."""
    p = row.params
    v = logits.shape[-1]
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_ids) | set(row.output_ids)), dtype=torch.long)
        seen = seen[seen < v]
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and row.output_ids:
        out = torch.tensor(row.output_ids, dtype=torch.long)
        counts = torch.bincount(out[out < v], minlength=v).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def process(logits: torch.Tensor, row: SampleRow) -> torch.Tensor:
    """One row's final sampling distribution (probabilities) — or its penalised logits if greedy."""
    p = row.params
    logits = logits.float().clone()
    if p.needs_penalties:
        apply_penalties(logits, row)
    if p.greedy:
        if not math.isfinite(float(logits.max())):  # max propagates NaN
            raise NonFiniteError("the logits are not finite after penalties")
        return logits
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = (cum - sorted_p) >= p.top_p  # keep the smallest prefix whose mass reaches top_p
        drop[0] = False
        probs = probs.scatter(0, idx, sorted_p.masked_fill(drop, 0.0))
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    total = probs.sum()
    if not 0.0 < float(total) < math.inf:  # (False for NaN too)
        raise NonFiniteError("the sampling distribution is not finite after penalties and temperature")
    return probs / total


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


class Sampler:
    """Samples one token per row; seeded rows use their own generator."""

    def __init__(self, seed: int | None = None) -> None:
        self.generator = torch.Generator()
        self.ops = layer_ops()
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[SampledToken]:
        """One token per row; a row that cannot be sampled gets a token with ``error`` set."""
        need_lp = any(r.params.logprobs is not None for r in rows)
        logprobs = torch.log_softmax(logits.float(), dim=-1) if need_lp else None
        raw, logits = logits, constrain(logits, rows)
        if all(r.params.greedy and not r.params.needs_penalties for r in rows):
            best = self.ops.argmax(logits)
            tokens = best.tolist()
            errors = {i: "the logits are not finite" for i in non_finite_rows(logits, best)}
        else:
            tokens, errors = self._per_row(logits, rows)
        if logits is not raw:  # a NaN the mask hid still spoils the row (and its logprobs)
            broken = set(non_finite_rows(raw))
            for i in [i for i in errors if i not in broken and rows[i].allowed is not None]:
                if not bool(torch.isfinite(logits[i]).any()):
                    errors[i] = DEAD_END
            errors |= {i: "the model's logits are not finite" for i in broken if i not in errors}
        out: list[SampledToken] = []
        for i, (tok, row) in enumerate(zip(tokens, rows)):
            if i in errors:
                out.append(SampledToken(-1, error=errors[i]))
            else:
                out.append(self.describe(tok, row, logprobs[i] if logprobs is not None else None))
        return out

    def _per_row(self, logits: torch.Tensor, rows: list[SampleRow]) -> tuple[list[int], dict[int, str]]:
        tokens: list[int] = []
        errors: dict[int, str] = {}
        for i, row in enumerate(rows):
            try:
                dist = process(logits[i], row)
                tok = int(dist.argmax().item()) if row.params.greedy else draw(dist, self._generator(row))
            except Exception as e:  # noqa: BLE001 - this row's own fault: its request fails, not the batch
                tok, errors[i] = -1, str(e) or type(e).__name__
            tokens.append(tok)
        return tokens, errors

    def _generator(self, row: SampleRow) -> torch.Generator:
        """A seeded row's draw depends on (seed, position) alone, not on earlier draws, so a
        stream resumed on another engine samples the same (engine/resume.py)."""
        if row.generator is None or row.params.seed is None:
            return self.generator
        return row.generator.manual_seed(position_seed(row.params.seed, len(row.output_ids)))

    @staticmethod
    def describe(tok: int, row: SampleRow, logprobs: torch.Tensor | None) -> SampledToken:
        """Attach the model's (raw) logprob of the chosen token and the top-n alternatives."""
        n = row.params.logprobs
        if logprobs is None or n is None:
            return SampledToken(tok)
        top = []
        if n > 0:
            vals, idx = torch.topk(logprobs, n)
            top = list(zip(idx.tolist(), vals.tolist()))
        return SampledToken(tok, float(logprobs[tok].item()), top)
