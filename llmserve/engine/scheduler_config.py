"""The scheduler's limits and budgets, validated once (the scheduler itself is pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    # Share of scheduled tokens guaranteed to lower-priority (batch) requests when
    # they have work; below it they are served first for a step.
    batch_min_share: float = 0.1
    # Smoothing of the per-class token accounting behind ``batch_min_share``.
    share_decay: float = 0.9
    # vLLM's knob: a prompt chunk is at most this many tokens per step (0: no cap).
    # Small chunks bound how long a realtime arrival waits for the step in progress.
    long_prefill_token_threshold: int = 0
    # Time-aware chunks: with the measured ``StepCosts`` handed to ``schedule``, a step
    # with prompt tokens lasts no longer than an idle prefill of ``step_budget_tokens``
    # (or ``step_time_budget_s``), whatever decodes share it; 0 / None: tokens only.
    step_budget_tokens: int = 48
    step_time_budget_s: float | None = None
    min_chunk_tokens: int = 16

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if not 0.0 <= self.batch_min_share < 1.0:
            raise ValueError("batch_min_share must be in [0, 1)")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if self.step_budget_tokens < 0 or self.min_chunk_tokens < 1 or (self.step_time_budget_s or 1) <= 0:
            raise ValueError("need step_budget_tokens >= 0, min_chunk_tokens >= 1, step_time_budget_s > 0")
