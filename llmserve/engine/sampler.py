"""Turn logits into tokens: penalties, temperature, top-k / top-p / min-p, seeds, logprobs.

``process`` produces the distribution a row actually samples from; speculative
decoding's rejection sampler reuses it so that speculation changes nothing about
what is sampled.

A row whose logits or distribution are not finite (NaN, inf, or no mass left) is
not sampled: its token carries an ``error`` and only its request fails. The check
costs one reduction over the whole batch when every row is fine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from llmserve.engine.outputs import TokenLogprob
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.ops import layer_ops


@dataclass(slots=True)
class SampleRow:
    """What the sampler needs to know about one row of logits."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]  # tokens generated so far (before this row's position)
    generator: torch.Generator | None


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


def non_finite_rows(logits: torch.Tensor) -> list[int]:
    """Rows of ``logits`` holding NaN or inf: one reduction when there are none.

    A sum is NaN or inf whenever any term is; a sum of large finite values that
    overflows only sends us to the exact per-row check.
    """
    if bool(torch.isfinite(logits.sum())):
        return []
    return (~torch.isfinite(logits).all(dim=-1)).nonzero().flatten().tolist()


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
        if all(r.params.greedy and not r.params.needs_penalties for r in rows):
            tokens = self.ops.argmax(logits).tolist()
            errors = {i: "the model's logits are not finite" for i in non_finite_rows(logits)}
        else:
            tokens, errors = self._per_row(logits, rows)
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
                tok = int(dist.argmax().item()) if row.params.greedy else draw(dist, row.generator or self.generator)
            except Exception as e:  # noqa: BLE001 - this row's own fault: its request fails, not the batch
                tok, errors[i] = -1, str(e) or type(e).__name__
            tokens.append(tok)
        return tokens, errors

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
