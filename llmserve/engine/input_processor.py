"""A request's input, tokenised and checked before it reaches the engine core.

vLLM v1's ``InputProcessor`` shape: both engine clients (in-thread and
multi-process) and ``EngineCore.add_request`` turn a prompt and its parameters
into a :class:`~llmserve.engine.request.Request` here, so bad input fails the
same way, at once, on the caller's side, whichever client serves it. It reads no
engine state (only the tokenizer and the model's fixed limits), so it is safe
from any thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from llmserve.engine.request import REALTIME, ContextLengthError, Request
from llmserve.engine.resume import check_resume
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from llmserve.priority import parse_priority


def no_grammar(params: SamplingParams) -> None:
    """For a client whose core compiles grammars where they run (a compiled one cannot
    cross a process boundary); schemas are checked at the edge."""
    return None


class InputProcessor:
    """Prompt and parameters to a :class:`Request`, or ``ValueError`` (``InvalidParameterError``,
    ``ContextLengthError``) naming what is wrong."""

    def __init__(self, tokenizer: Any | None, vocab_size: int, max_model_len: int, eos_token_ids: frozenset[int],
                 compile_grammar: Callable[[SamplingParams], Any] = no_grammar) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.compile_grammar = compile_grammar

    def process(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
                priority: int | str | None = 0, cache_salt: str | None = None, arrival_time: float | None = None,
                resume_token_ids: list[int] | None = None, lora_name: str | None = None) -> tuple[Request, str | None]:
        """The request and its prompt text (None when the prompt came as token ids)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass token ids")
            if not prompt:
                raise InvalidParameterError("prompt", "must not be empty")
            prompt_ids = self.tokenizer.encode(prompt)
            prompt_text: str | None = prompt
        else:
            prompt_ids = [int(t) for t in prompt]
            prompt_text = None
        if not prompt_ids:
            raise InvalidParameterError("prompt", "must not be empty")
        keep = params.truncate_prompt_tokens
        if keep is not None:  # vLLM's: the last tokens are kept (-1: as many as the context holds)
            prompt_ids = prompt_ids[-(self.max_model_len if keep == -1 else keep):]
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise InvalidParameterError("cache_salt", "must be a string")
        vocab = self.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_ids):
            raise InvalidParameterError("prompt", f"has token ids outside the vocabulary [0, {vocab})")
        n_prompt = len(prompt_ids)
        if n_prompt >= self.max_model_len:
            raise ContextLengthError(n_prompt, self.max_model_len)
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n_prompt
        if n_prompt + max_tokens > self.max_model_len:
            raise ContextLengthError(n_prompt, self.max_model_len, max_tokens)
        if params.min_tokens > max_tokens:  # (max_tokens not given: the context's end is its bound, as vLLM's)
            raise InvalidParameterError("min_tokens", f"must be less than or equal to max_tokens ({max_tokens}), "
                                                      f"got {params.min_tokens}")
        try:
            prio = parse_priority(priority)
        except ValueError as e:
            raise InvalidParameterError("priority", str(e).removeprefix("priority ")) from None
        prio = REALTIME if prio is None else prio
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise InvalidParameterError("logit_bias", f"has token ids outside the vocabulary [0, {vocab})")
        grammar = self.compile_grammar(params)
        now = arrival_time if arrival_time is not None else time.monotonic()
        req = Request(request_id, prompt_ids, params, max_tokens, arrival_time=now, priority=prio,
                      cache_salt=cache_salt, lora_name=lora_name, eos_token_ids=self.eos_token_ids, grammar=grammar,
                      all_token_ids=prompt_ids + check_resume(resume_token_ids, vocab, max_tokens))
        return req, prompt_text
