"""What the engine hands back to callers, per step and at the end."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class CompletionOutput:
    """One sequence's progress. Every output carries the ``delta_*`` fields (since the
    previous output); the whole-sequence fields (``text``, ``token_ids``,
    ``logprobs``) are filled on the final output only and are empty before it, so an
    output queued for a slow reader holds one step's tokens, not a copy of all."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None
    # Since the previous output of this request (for streaming).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[TokenLogprob] | None = None
    # vLLM's: the sampled tokens' logprobs summed (None without logprobs); set by ``merge_choices``
    cumulative_logprob: float | None = None


@dataclass(slots=True)
class Logprob:
    """vLLM's: one token's entry in ``LLM.generate``'s ``logprobs`` (a dict per position,
    token id -> this). ``rank`` is None for a sampled token outside the top ``logprobs``
    (the sampler does not rank the whole vocabulary)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt: str | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    error: str | None = None
    spans: list[list] | None = None  # a traced request's engine spans, on its final output
    prompt_logprobs: None = None  # vLLM's attribute; SamplingParams refuses prompt_logprobs

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


def merge_choices(outs: list[RequestOutput], request_id: str) -> RequestOutput:
    """Combine the final outputs of ``n`` fan-out sequences into one output with n choices."""
    comps = []
    for i, o in enumerate(outs):
        c = o.outputs[0]
        cum = None if c.logprobs is None else sum(lp.logprob for lp in c.logprobs)
        comps.append(CompletionOutput(i, c.text, c.token_ids, c.finish_reason, c.stop_reason, c.logprobs,
                                      cumulative_logprob=cum))
    first = outs[0]
    return RequestOutput(request_id, first.prompt_token_ids, comps, all(o.finished for o in outs),
                         first.prompt, first.num_cached_tokens, first.metrics,
                         next((o.error for o in outs if o.error is not None), None))
