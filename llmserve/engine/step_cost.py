"""What a step costs on this machine, learnt from the engine's own step timings.

The scheduler sizes prompt chunks by time, not by a token count: a step that
carries a prompt chunk should last no longer than an idle prefill of a short
prompt, so a realtime request that arrives during it waits about as long again
as it would on an idle engine, on any machine, with any batch of decodes.

A step's time is close to ``base + prefill_tokens * per_token + decodes *
per_decode`` (the base streams the weights once; a chunk token or a decoding row
is GEMM work), plus attention over the context before each chunk token. The
prior's shape is kept and two scales are learnt: one from decode-only steps (the
base and per-decode part), one from steps that carry prompt tokens (the rest), each
an EWMA of measured over predicted. Two numbers cannot be driven far off by a
burst of odd steps, and the fit stays right when only one kind of step runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Seconds per step part. Defaults: SmolLM2-135M int8 on 2 AVX2 cores (measured)."""

    base_s: float = 0.008
    prefill_token_s: float = 0.0011
    decode_seq_s: float = 0.003
    # Extra per prompt token for each 1,024 tokens of context before it (attention).
    context_s: float = 0.0005
    # A draft token's row in a decoding step (speculation): the kernels' few-row path
    # reads the weights once for all rows, so a row adds its arithmetic only (8-row
    # verification steps took ~2.2 one-row steps: benchmarks/spec/README.md).
    draft_row_s: float = 0.0017

    def prefill(self, n: int, start: int) -> float:
        """Seconds to compute prompt tokens ``start .. start + n``."""
        return n * (self.prefill_token_s + self.context_s * (start + n / 2) / 1024)

    def step(self, prefill_tokens: int, decode_seqs: int, start: int = 0, draft_rows: int = 0) -> float:
        return (self.base_s + self.prefill(prefill_tokens, start) + decode_seqs * self.decode_seq_s
                + draft_rows * self.draft_row_s)

    def tokens_within(self, seconds: float, start: int) -> int:
        """The most prompt tokens from ``start`` that fit in ``seconds``."""
        if seconds <= 0:
            return 0
        a = self.context_s / 2048  # n^2 term of prefill(n, start)
        b = self.prefill_token_s + self.context_s * start / 1024
        if a <= 0:
            return int(seconds / b)
        return int((-b + (b * b + 4 * a * seconds) ** 0.5) / (2 * a))


class StepCostModel:
    """Online fit of :class:`StepCosts` to observed steps (plain arithmetic, no clock)."""

    def __init__(self, prior: StepCosts | None = None, alpha: float = 0.1, min_prefill: int = 16) -> None:
        self.prior = prior or StepCosts()
        self.alpha = alpha
        self.min_prefill = min_prefill  # smaller chunks say little about per-token cost
        self.decode_scale = 1.0
        self.prefill_scale = 1.0
        self.observed = 0

    def observe(self, prefill_tokens: int, decode_seqs: int, prefill_start: int, seconds: float,
                draft_rows: int = 0) -> None:
        """One step: prompt tokens computed (from context ``prefill_start`` on average), decodes,
        their draft tokens, time."""
        p = self.prior
        fixed = p.base_s + decode_seqs * p.decode_seq_s + draft_rows * p.draft_row_s
        a = self.alpha
        self.observed += 1
        if prefill_tokens == 0:
            self.decode_scale += a * (_clamp(seconds / fixed) - self.decode_scale)
        elif prefill_tokens >= self.min_prefill:
            rest = seconds - self.decode_scale * fixed
            self.prefill_scale += a * (_clamp(rest / p.prefill(prefill_tokens, prefill_start))
                                       - self.prefill_scale)

    def costs(self) -> StepCosts:
        p, d, s = self.prior, self.decode_scale, self.prefill_scale
        return replace(p, base_s=p.base_s * d, decode_seq_s=p.decode_seq_s * d, draft_row_s=p.draft_row_s * d,
                       prefill_token_s=p.prefill_token_s * s, context_s=p.context_s * s)


def _clamp(ratio: float) -> float:
    # One step descheduled by the OS (shared cores) must not swing the fit tenfold.
    return min(max(ratio, 0.1), 10.0)
