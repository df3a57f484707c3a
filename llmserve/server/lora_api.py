"""The instance's LoRA API, vLLM's: adapters as models, loaded and unloaded at run time.

- a request whose ``model`` is an adapter's name runs with that adapter;
- ``/v1/models`` lists each adapter after the base, with ``parent`` (the base's id) and
  ``root`` (its path);
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` reads and checks the file, then
  registers it (200, text as vLLM's); a bad file, a rank over ``--max-lora-rank``, a target
  module the model lacks or a name in use answer 400 naming it, and nothing is registered;
- ``POST /v1/unload_lora_adapter {"lora_name"}``: 404 for a name not loaded. Requests already
  running on it finish with it.

With ``--admin-key`` set, the two POSTs need it (``x-admin-key`` or ``Authorization: Bearer``;
the API key, when there is one, still goes in ``Authorization``). With neither key, only an
instance on a loopback address loads and unloads (403 elsewhere: anyone who reaches it could
make it read files of this machine; vLLM gates the same routes behind an environment
switch). ``llmserve:lora_resident``
says per adapter whether it is resident (1) or only registered (0), the routing signal; vLLM's
``vllm:lora_requests_info`` counts requests in flight instead.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from llmserve.api.errors import APIError
from llmserve.api.limits import bearer_token, find_key
from llmserve.api.parse import parse_model
from llmserve.ports import is_loopback


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None  # vLLM's clients may send it; the name is what counts


def adapter_named(engine: Any, served_names: list[str], model: str | None) -> str | None:
    """The adapter ``model`` names on ``engine`` (None: a base model name, or no adapter)."""
    adapters = (getattr(engine, "lora", None) or {}).get("adapters", {})
    return model if model in adapters and model not in served_names else None


def adapter_cards(engine: Any, base_id: str, created: int) -> list[dict[str, Any]]:
    """``/v1/models`` entries of the engine's adapters, vLLM's shape."""
    adapters = (getattr(engine, "lora", None) or {}).get("adapters", {})
    return [{"id": name, "object": "model", "created": created, "owned_by": "llmserve", "root": path,
             "parent": base_id, "max_model_len": None} for name, path in adapters.items()]


def lora_residency(model_name: str, engine: Any, snap: dict[str, Any]):
    """``llmserve:lora_resident{model_name, adapter}``: 1 resident, 0 registered only."""
    from prometheus_client.core import GaugeMetricFamily

    g = GaugeMetricFamily("llmserve:lora_resident", "LoRA adapter resident in a slot (1) or only registered (0).",
                          labels=["model_name", "adapter"])
    resident = set(snap.get("lora_adapters", []))
    for name in (getattr(engine, "lora", None) or {}).get("adapters", {}):
        g.add_metric([model_name, name], 1.0 if name in resident else 0.0)
    return g


def add_lora_routes(app: FastAPI, inst: Any) -> None:
    """The load / unload routes on the instance's app (``inst``: ``server.app.Instance``)."""
    cfg = inst.config

    def engine(request: Request):
        key = cfg.admin_key
        if key is not None:
            given = request.headers.get("x-admin-key", "").encode() or bearer_token(request.headers.get("authorization"))
            if find_key(given, [key.get_secret_value().encode()]) is None:
                raise APIError(401, "a valid admin key is required to load or unload adapters",
                               code="invalid_admin_key")
        elif not cfg.api_keys and not is_loopback(cfg.host):  # (files on this machine, read for anyone)
            raise APIError(403, "loading or unloading adapters on an address other than loopback needs a key: "
                                "start the instance with --admin-key (or --api-key)", code="admin_key_required")
        if inst.engine is None:
            raise APIError(503, f"the instance is not running an engine ({inst.state.value})", "service_unavailable")
        return inst.engine

    def refused(e: Exception, param: str) -> APIError:
        from llmserve.engine.lora.manager import UnknownAdapter

        if isinstance(e, UnknownAdapter):
            return APIError(404, str(e), "not_found_error", param, "lora_adapter_not_found")
        if isinstance(e, ValueError):
            return APIError(400, str(e), param=param, code="invalid_lora_adapter")
        raise e

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        eng = engine(request)
        body = parse_model(await request.body(), LoadLoraAdapterRequest)
        if body.lora_name in cfg.served_names(inst.model_name):
            raise APIError(400, f"the name {body.lora_name!r} is the base model's", param="lora_name",
                           code="invalid_lora_adapter")
        started = time.perf_counter()
        try:
            await eng.load_lora(body.lora_name, body.lora_path)
        except Exception as e:  # noqa: BLE001 - a refusal says why; anything else is ours (500)
            raise refused(e, "lora_path" if "already loaded" not in str(e) else "lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.",
                                 headers={"x-load-ms": f"{(time.perf_counter() - started) * 1e3:.1f}"})

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        eng = engine(request)
        body = parse_model(await request.body(), UnloadLoraAdapterRequest)
        try:
            await eng.unload_lora(body.lora_name)
        except Exception as e:  # noqa: BLE001 - as above
            raise refused(e, "lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
