"""What a client is told when the engine ends or refuses its request with an error."""

from __future__ import annotations

import logging

from llmserve.api.errors import APIError
from llmserve.engine.client import EngineDeadError, RequestFailedError
from llmserve.engine.lora.manager import AdapterUnavailable, UnknownAdapter
from llmserve.engine.sampler import DEAD_END

log = logging.getLogger(__name__)


def engine_error(e: Exception) -> APIError:
    """The OpenAI error for ``e``: the engine died (503, another instance may serve it), the
    request failed alone (500), or the engine refused it at enqueue (its adapter: 404 / 503;
    its own input: 400)."""
    if isinstance(e, APIError):  # (the client left: 499)
        return e
    if isinstance(e, EngineDeadError):
        return APIError(503, f"the engine failed: {e}; retry on another instance", "service_unavailable",
                        code="engine_dead", headers={"Retry-After": "1"})
    if isinstance(e, RequestFailedError) and DEAD_END in str(e):  # its own schema / regex / grammar
        made = len(e.output.outputs[0].token_ids) if e.output.outputs else 0
        return APIError(400, f"{DEAD_END}: the constraint reaches a dead end after {made} generated tokens",
                        code="invalid_grammar")
    if isinstance(e, RequestFailedError):
        return APIError(500, f"the request failed: {e}", "server_error", code="request_failed")
    if isinstance(e, UnknownAdapter):  # unloaded between the check and the engine
        return APIError(404, str(e), "not_found_error", "model", "model_not_found")
    if isinstance(e, AdapterUnavailable):  # the instance's file, not the client's request
        return APIError(503, str(e), "service_unavailable", code="adapter_unavailable")
    if isinstance(e, ValueError):
        return APIError(400, str(e))
    log.error("a request failed: %s: %s", type(e).__name__, e, exc_info=e)  # (a fault of ours: its trace kept)
    return APIError(500, str(e) or type(e).__name__, "server_error")
