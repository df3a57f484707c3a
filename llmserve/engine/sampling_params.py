"""Per-request sampling parameters, shaped like vLLM's so users feel at home."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

MAX_LOGPROBS = 20
LOGIT_BIAS_LIMIT = 100.0
# vLLM asks only for > 0, but 1e-300 is 0 in fp32 and turns logits into inf: these
# bounds stay far from fp32's limits (a penalty of 100 already all but bans a token).
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
# Above this every realistic logit range samples as good as uniformly.
MAX_TEMPERATURE = 100.0
# What ``torch.Generator.manual_seed`` takes (it reads a seed modulo 2**64).
MIN_SEED, MAX_SEED = -2**63, 2**64 - 1


@dataclass(slots=True)
class StructuredOutputsParams:
    """What the output must match: exactly one of the fields (vLLM's names).

    ``json`` is a JSON Schema (dict or text), ``json_object`` any JSON object,
    ``regex`` a regular expression, ``choice`` one of the strings, ``grammar`` an
    EBNF (GBNF) grammar, ``structural_tag`` an xgrammar structural tag (free text
    with constrained tagged regions, e.g. tool calls). ``after_reasoning``: a reasoning
    style (``reasoning_gate.STYLES``) whose ``<think>`` part the constraint leaves free.
    """

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    after_reasoning: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar", "structural_tag") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        _check(len(given) == 1, "structured_outputs",
               f"needs exactly one of json, json_object, regex, choice, grammar, structural_tag; got {given or 'none'}")
        _check(self.choice is None or len(self.choice) > 0, "structured_outputs.choice", "must not be empty")
        _check(self.after_reasoning in (None, "qwen3", "deepseek_r1"), "structured_outputs.after_reasoning",
               f"must be qwen3 or deepseek_r1, got {self.after_reasoning!r}")

    def key(self) -> tuple[str, str]:
        """(kind, text): equal constraints share one compiled grammar. Keys keep their order:
        a schema's property order is the order the output follows."""
        import json as _json

        for kind in ("json", "structural_tag"):
            v = getattr(self, kind)
            if v is not None:
                return kind, v if isinstance(v, str) else _json.dumps(v)
        if self.choice is not None:
            return "choice", _json.dumps(self.choice)
        if self.regex is not None:
            return "regex", self.regex
        if self.grammar is not None:
            return "grammar", self.grammar
        return "json_object", ""


class RequestOutputKind(IntEnum):
    """vLLM's. ``LLM.generate`` returns final outputs whatever it says, as vLLM's ``LLM``
    (which sets ``FINAL_ONLY``); an engine's own outputs carry each step's delta and the
    whole sequence at the end."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass(slots=True)
class SamplingParams:
    """How one request turns logits into tokens and when it stops.

    ``temperature=0`` means greedy. ``top_k`` of 0 or -1 disables top-k.
    ``max_tokens=None`` means "up to the model's context". Every float must be finite
    and stay finite and non-zero in fp32 (a request that overflows the sampler must
    not reach it).
    """

    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # token id -> added to its logit before sampling (OpenAI's logit_bias, [-100, 100])
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's: until the output has this many tokens, EOS and stop_token_ids are masked out
    # (sampler.py) and stop strings are not applied to their text (output_processor.py)
    min_tokens: int = 0
    # vLLM's names. best_of: only n (as vLLM V1); prompt_logprobs: only None
    best_of: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True  # False: no text, token ids only (output_processor)
    spaces_between_special_tokens: bool = True  # only True: special tokens are joined as decoded
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens (-1: max_model_len)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        _check(self.n >= 1, "n", f"must be at least 1, got {self.n}")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens",
               f"must be at least 1, got {self.max_tokens}")
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens",
               f"must be at least 0, got {self.min_tokens}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"must be less than or equal to max_tokens ({self.max_tokens}), got {self.min_tokens}")
        _check(_finite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE, "temperature",
               f"must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        _check(_finite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, "top_k", f"must be -1 (disabled) or positive, got {self.top_k}")
        _check(_finite(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(_finite(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
               f"must be in [-2, 2], got {self.presence_penalty}")
        _check(_finite(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
               f"must be in [-2, 2], got {self.frequency_penalty}")
        _check(_finite(self.repetition_penalty)
               and MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
               "repetition_penalty", f"must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}], "
               f"got {self.repetition_penalty}")
        _check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
               f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        _check(self.seed is None or (isinstance(self.seed, int) and MIN_SEED <= self.seed <= MAX_SEED), "seed",
               f"must be an integer in [-2**63, 2**64 - 1], got {self.seed}")
        _check(self.best_of is None or self.best_of == self.n, "best_of",
               f"other than n is not supported (as vLLM V1), got {self.best_of} with n={self.n}")
        _check(self.prompt_logprobs is None, "prompt_logprobs", "is not supported: prefill keeps no logprobs")
        _check(self.spaces_between_special_tokens, "spaces_between_special_tokens", "False is not supported")
        _check(self.detokenize or not self.stop, "stop", "strings need detokenize=True (as vLLM)")
        _check(self.truncate_prompt_tokens is None or (isinstance(self.truncate_prompt_tokens, int)
               and (self.truncate_prompt_tokens == -1 or self.truncate_prompt_tokens >= 1)),
               "truncate_prompt_tokens", f"must be -1 or at least 1, got {self.truncate_prompt_tokens}")
        self.output_kind = RequestOutputKind(self.output_kind)
        if self.logit_bias:
            _check(all(isinstance(t, int) and t >= 0 for t in self.logit_bias), "logit_bias",
                   "keys must be non-negative token ids")
            _check(all(-LOGIT_BIAS_LIMIT <= v <= LOGIT_BIAS_LIMIT for v in self.logit_bias.values()), "logit_bias",
                   f"values must be in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]")
        else:
            self.logit_bias = None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


class InvalidParameterError(ValueError):
    """A request parameter is out of range; ``param`` names it (OpenAI's error ``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param


def child_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th of ``n`` sequences: wraps as torch does, so it is always valid."""
    return (seed + index) % 2**64


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidParameterError(param, message)
