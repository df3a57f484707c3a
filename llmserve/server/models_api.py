"""``GET /v1/models`` and ``GET /v1/models/{model}`` on an instance: its served names, then
its LoRA adapters (``lora_api.adapter_cards``), as OpenAI's and vLLM's model objects; and
vLLM's ``GET /version``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI

from llmserve.api.errors import APIError
from llmserve.api.model_list import model_list, with_anthropic_fields
from llmserve.engine.core_proc import model_facts
from llmserve.server.lora_api import adapter_cards


def _model_facts(engine: Any) -> dict[str, Any]:
    """Family and context length, from the engine process's ready message or the in-process core."""
    if engine is None:
        return {"family": None, "context_length": None}
    info = getattr(engine, "info", None)
    if isinstance(info, dict):
        return {k: info.get(k) for k in ("family", "context_length")}
    return model_facts(engine.core.model_config)


def add_model_routes(app: FastAPI, inst: Any) -> None:
    """The model routes on the instance's app (``inst``: ``server.app.Instance``)."""
    cfg = inst.config
    created = int(time.time())  # one time per server, as the gateway's: a list and a retrieve agree

    def cards() -> list[dict[str, Any]]:
        names = cfg.served_names(inst.model_name) if inst.model_name else []
        facts = _model_facts(inst.engine)
        return [{"id": n, "object": "model", "created": created, "owned_by": "llmserve",
                 "max_model_len": inst.engine.max_model_len if inst.engine else None,
                 "root": inst.engine.model_name if inst.engine else n, "parent": None,
                 **facts} for n in names] + (adapter_cards(inst.engine, names[0], created) if names else [])

    @app.get("/version")  # vLLM's: which server build answers
    async def version():
        from llmserve import __version__

        return {"version": __version__}

    @app.get("/v1/models")
    async def models():
        return model_list(cards())

    # (":path": a served name may hold a slash, "org/model"; the SDK's %2F arrives decoded)
    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        for card in cards():
            if card["id"] == model:
                return with_anthropic_fields(card)
        if not inst.model_name:  # still loading: its names are not known yet, so nothing is "not served"
            raise APIError(503, f"the instance is not ready ({inst.state.value})", "service_unavailable",
                           headers={"Retry-After": "1"})
        raise APIError(404, f"The model `{model}` does not exist.", "not_found_error", "model", "model_not_found")
