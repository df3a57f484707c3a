"""A request's token state as the scheduler and runner see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from llmserve.engine.sampling_params import SamplingParams
from llmserve.priority import BATCH, REALTIME  # noqa: F401 (re-exported: the levels by name)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # this request alone failed (its scheduling, sampling or text)

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.finished else None


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
             RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR}


@dataclass(eq=False)
class Request:
    """One sequence being generated.

    There is no prefill or decode phase: the request has ``num_tokens`` tokens and
    ``num_computed_tokens`` of them have KV in the cache; each step computes some of
    the rest. ``spec_token_ids`` are draft tokens proposed for the next step; they are
    not part of ``all_token_ids`` until accepted.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int
    arrival_time: float = 0.0
    priority: int = REALTIME
    cache_salt: str | None = None
    lora_name: str | None = None  # the LoRA adapter it runs with (None: the base model)
    lora_id: int = 0  # that adapter's load, set by the engine at enqueue (0: none); keys its KV
    rope_offset: int = 0  # added to its positions (models/rope.py offset_for), set at enqueue; keys its KV
    eos_token_ids: frozenset[int] = frozenset()
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    spec_token_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    stop_reason: int | str | None = None
    grammar: Any = None  # the compiled grammar of a structured output (engine/guided.py); the scheduler never reads it
    error: str | None = None  # why it failed, when its status is FINISHED_ERROR
    trace: str | None = None  # the caller's W3C traceparent: its spans are recorded (engine/trace_spans.py)

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[len(self.prompt_token_ids):]

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def is_batch_class(self) -> bool:
        return self.priority > REALTIME


class ContextLengthError(ValueError):
    """The prompt (plus max_tokens) does not fit the model's context."""

    def __init__(self, prompt_tokens: int, limit: int, max_tokens: int | None = None) -> None:
        if max_tokens is None:
            msg = (f"This model's maximum context length is {limit} tokens, but the prompt has "
                   f"{prompt_tokens} tokens (at least one token must be generated).")
        else:
            msg = (f"This model's maximum context length is {limit} tokens. However, you requested "
                   f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} "
                   f"for the completion). Please reduce the prompt or max_tokens.")
        super().__init__(msg)
        self.prompt_tokens = prompt_tokens
        self.limit = limit
