"""vLLM's ``truncate_prompt_tokens`` at the API: the prompt is cut here, before admission, so
the kept tokens are what usage, echo and the queue count (the engine would cut it again, a no-op)."""

from __future__ import annotations

from llmserve.api.errors import APIError


def truncate_prompts(prompts: list[list[int]], keep: int | None, max_model_len: int) -> list[list[int]]:
    """Each prompt's last ``keep`` tokens (-1: ``max_model_len``); more than the context is a 400, as vLLM's."""
    if keep is None:
        return prompts
    if keep > max_model_len:
        raise APIError(400, f"truncate_prompt_tokens ({keep}) is greater than max_model_len ({max_model_len}): "
                            "select a smaller truncation size", param="truncate_prompt_tokens")
    n = max_model_len if keep == -1 else keep
    return [p[-n:] for p in prompts]
