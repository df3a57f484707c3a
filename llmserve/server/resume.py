"""What an instance accepts as a resumed stream (``resume_token_ids``, engine/resume.py).

The gateway resumes one streamed choice whose text is plain: a request with more
choices or prompts, or one whose output is parsed for tool calls (the parser's
state is not rebuilt from the text), is refused with a 400 that says why.
"""

from __future__ import annotations

from llmserve.api.errors import APIError
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest


def check_resume(r: CompletionRequest | ChatCompletionRequest, num_prompts: int) -> list[int] | None:
    """The request's resumed output tokens, if it is one that can be resumed; None if not resumed."""
    ids = r.resume_token_ids
    if ids is None:
        return None
    why = None
    if not r.stream:
        why = "continues a stream: stream must be true"
    elif r.n > 1 or (r.best_of or 1) > 1 or num_prompts > 1:
        why = "continues one choice of one prompt"
    elif isinstance(r, ChatCompletionRequest) and r.tool_mode != "none":
        why = "cannot continue a stream parsed for tool calls"
    if why is not None:
        raise APIError(400, f"resume_token_ids {why}", param="resume_token_ids", code="unsupported_parameter")
    return list(ids)
