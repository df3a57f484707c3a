"""The scheduler's limits and budgets, validated once (the scheduler itself is pure).

Built by the engine from its ``EngineConfig``; frozen like every config here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(512, ge=1)
    max_model_len: int = Field(2048, ge=1)
    # Share of scheduled tokens guaranteed to lower-priority (batch) requests when
    # they have work; below it they are served first for a step.
    batch_min_share: float = Field(0.1, ge=0.0, lt=1.0)
    # Smoothing of the per-class token accounting behind ``batch_min_share``.
    share_decay: float = Field(0.9, ge=0.0, le=1.0)
    # vLLM's knob: a prompt chunk is at most this many tokens per step (0: no cap).
    # Small chunks bound how long a realtime arrival waits for the step in progress.
    long_prefill_token_threshold: int = Field(0, ge=0)
    # Time-aware chunks: with the measured ``StepCosts`` handed to ``schedule``, a step
    # with prompt tokens lasts no longer than an idle prefill of ``step_budget_tokens``
    # (or ``step_time_budget_s``), whatever decodes share it; 0 / None: tokens only.
    step_budget_tokens: int = Field(48, ge=0)
    step_time_budget_s: float | None = Field(None, gt=0.0)
    min_chunk_tokens: int = Field(16, ge=1)
    # Distinct LoRA adapters among running requests at most (the resident slots); 0: no LoRA.
    max_loras: int = Field(0, ge=0)
