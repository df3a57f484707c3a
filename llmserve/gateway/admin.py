"""The admin API under ``/admin/``, protected by the admin key.

Send the key as ``Authorization: Bearer <admin_key>`` (or ``x-admin-key``). With
no admin key configured the whole API answers 404.

- ``GET  /admin/models``                                   versions, weights, canary state
- ``GET  /admin/models/{model}/canary``                    canary status
- ``GET  /admin/models/{model}/canary/history``            events with times and reasons
- ``POST /admin/models/{model}/canary/{action}``           start | promote | rollback | pause
                                                           | resume; body ``{"reason": ...}``
- ``GET  /admin/models/{model}/timeline``                  every pool of the model on one time axis:
                                                           weights, instances, canary verdicts, scaling,
                                                           interventions (``?since=<unix>&download=true``)
- ``GET  /admin/pools``                                    every pool: instances, queues
- ``POST /admin/models/{m}/versions/{v}/instances``        ``{"url", "instance_id"?}``
- ``DELETE /admin/models/{m}/versions/{v}/instances/{id}``
- ``POST /admin/models/{m}/versions/{v}/instances/{id}/drain``  ``{"draining": true}``
- ``GET  /admin/keys/{name}/usage``                        a named key's usage and limits (gateway/tenants)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from llmserve.api.limits import bearer_token, find_key
from llmserve.gateway.canary import InvalidTransition
from llmserve.gateway.errors import GatewayError
from llmserve.state.instance_overrides import InstanceOp
from llmserve.state.replica import Frozen

if TYPE_CHECKING:
    from llmserve.gateway.runtime import Gateway, ModelRuntime

CANARY_ACTIONS = ("start", "promote", "rollback", "pause", "resume")


class ReasonBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, max_length=500)  # kept in the history: bounded, as a scale's is


class AddInstanceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    instance_id: str | None = None


class DrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    draining: bool = True


def admin_guard(gw: Gateway) -> Callable[[Request], None]:
    """The admin-key check, as a FastAPI dependency (other admin routers reuse it)."""
    key = gw.config.auth.admin_key

    def require_admin(request: Request) -> None:
        if key is None:
            raise GatewayError(404, "the admin API is disabled (no admin_key configured)",
                               code="not_found")
        given = bearer_token(request.headers.get("authorization")) or \
            request.headers.get("x-admin-key", "").encode()
        if find_key(given, [key.get_secret_value().encode()]) is None:
            raise GatewayError(401, "a valid admin key is required", code="invalid_admin_key")

    return require_admin


def admin_router(gw: Gateway) -> APIRouter:
    r = APIRouter(prefix="/admin", dependencies=[Depends(admin_guard(gw))])

    def runtime(model: str) -> ModelRuntime:
        rt = gw.models.get(model)
        if rt is None:
            raise GatewayError(404, f"no model {model!r}", code="model_not_found")
        return rt

    async def canary_of(model: str):
        rt = runtime(model)
        if rt.canary is None:
            raise GatewayError(404, f"model {model!r} has no canary configured",
                               code="no_canary")
        await gw.shared.rollouts.refresh(rt)  # what the replicas agree on, not this one's last poll
        return rt

    @r.get("/models")
    async def models() -> dict:
        for rt in gw.models.values():
            await gw.shared.rollouts.refresh(rt)
        return {"models": [rt.describe() for rt in gw.models.values()]}

    @r.get("/models/{model:path}/canary")
    async def canary_status(model: str) -> dict:
        return (await canary_of(model)).canary.status()

    @r.get("/models/{model:path}/canary/history")
    async def canary_history(model: str) -> dict:
        return {"events": (await canary_of(model)).canary.events()}

    @r.post("/models/{model:path}/canary/{action}")
    async def canary_action(model: str, action: str, body: ReasonBody | None = None) -> dict:
        rt = await canary_of(model)
        if action not in CANARY_ACTIONS:
            raise GatewayError(404, f"unknown canary action {action!r}; one of {CANARY_ACTIONS}",
                               code="unknown_action")
        reason = (body.reason if body else None) or f"admin {action}"
        try:
            await gw.shared.rollouts.act(rt, action, reason)
        except InvalidTransition as e:
            raise GatewayError(409, str(e), code="invalid_transition") from None
        except Frozen as e:
            raise GatewayError(503, str(e), code="shared_state_frozen") from None
        gw.timeline.intervention(time.time(), model, rt.canary.canary, f"canary_{action}", reason)
        return rt.canary.status()

    @r.get("/models/{model:path}/timeline")
    async def timeline(model: str, since: float = Query(0.0, allow_inf_nan=False),  # NaN: invalid JSON back
                       limit: int = Query(3600, ge=1, le=100_000),
                       download: bool = False) -> Response:
        runtime(model)
        body = json.dumps(gw.model_timeline(model, since, limit))
        headers = {"content-disposition": f'attachment; filename="timeline-{model}.json"'} if download else None
        return Response(body, media_type="application/json", headers=headers)

    @r.get("/pools")
    async def pools() -> dict:
        return {"pools": [rt.describe_pool(v) for rt in gw.models.values() for v in rt.pools]}

    def pool_of(model: str, version: str):
        rt = runtime(model)
        if version in rt.adapters:  # its instances are its pool's: change them there
            raise GatewayError(400, f"version {version!r} is an adapter on version {rt.config.pool_of(version)!r}'s "
                                    "pool; its instances are that version's", code="adapter_version")
        if version not in rt.pools:
            raise GatewayError(404, f"model {model!r} has no version {version!r}",
                               code="version_not_found")
        return rt.pools[version]

    async def override(model: str, op: InstanceOp) -> None:
        """An instance change, on every replica (``state/instance_overrides.py``)."""
        if gw.controlled:  # the controller would go on counting (and billing) what it no longer routes to
            raise GatewayError(409, f"pool {model}/{op.version}'s instances are its elastic controller's "
                                    "(llmserve serve): pin its size with POST /admin/autoscale/scale, or drain "
                                    "and replace one with POST /admin/autoscale/instances/{id}/reclaim",
                               code="controlled_pool")
        try:
            await gw.shared.overrides.apply(runtime(model), op)
        except ValueError as e:
            raise GatewayError(400, str(e), code="invalid_instance") from None
        except LookupError:
            raise GatewayError(404, f"no instance {op.instance_id!r}", code="instance_not_found") from None
        except Frozen as e:
            raise GatewayError(503, str(e), code="shared_state_frozen") from None

    @r.get("/models/{model:path}/versions/{version}/instances")
    async def list_instances(model: str, version: str) -> dict:
        return {"instances": pool_of(model, version).snapshot()}

    @r.post("/models/{model:path}/versions/{version}/instances", status_code=201)
    async def add_instance(model: str, version: str, body: AddInstanceBody) -> dict:
        pool = pool_of(model, version)
        try:
            url, instance_id = pool.check_new(body.url, body.instance_id)
        except ValueError as e:
            raise GatewayError(400, str(e), code="invalid_instance") from None
        await override(model, InstanceOp(op="add", version=version, instance_id=instance_id, url=url))
        gw.timeline.intervention(time.time(), model, version, "instance_add", instance_id)
        return {"instance_id": instance_id, "url": url}

    @r.delete("/models/{model:path}/versions/{version}/instances/{instance_id}")
    async def remove_instance(model: str, version: str, instance_id: str) -> dict:
        pool_of(model, version)
        await override(model, InstanceOp(op="remove", version=version, instance_id=instance_id))
        gw.timeline.intervention(time.time(), model, version, "instance_remove", instance_id)
        return {"removed": instance_id}

    @r.post("/models/{model:path}/versions/{version}/instances/{instance_id}/drain")
    async def drain_instance(model: str, version: str, instance_id: str,
                             body: DrainBody | None = None) -> dict:
        pool_of(model, version)
        draining = body.draining if body else True
        await override(model, InstanceOp(op="drain", version=version, instance_id=instance_id,
                                         draining=draining))
        gw.timeline.intervention(time.time(), model, version, "instance_drain" if draining else "instance_undrain",
                                 instance_id)
        return {"instance_id": instance_id, "draining": draining}

    return r
