"""The elastic controller's admin API, under ``/admin/autoscale/`` (admin key required).

A pool is named ``model/version`` (``?pool=``); it may be left out when the
gateway has one controlled pool.

- ``GET  /admin/autoscale/pools``        policy, bounds, counts by state, desired, override
                                         (``?pool=``: that one; an unknown one is a 404)
- ``GET  /admin/autoscale/instances``    every instance: state, reason, in pool, load
- ``GET  /admin/autoscale/events``       transitions and actions (``?since=<seq>&limit=``)
- ``GET  /admin/autoscale/decisions``    each tick's count and the policy's reason
                                         (``?since=&limit=&changes_only=true``)
- ``GET  /admin/autoscale/timeline``     per-tick signals (``?since=<unix time>&limit=``)
- ``GET  /admin/autoscale/targets``      the live instances in Prometheus ``http_sd`` format, so
                                         Prometheus scrapes engines that come and go
- ``POST /admin/autoscale/instances/{id}/reclaim?notice_s=`` simulate a spot reclaim (providers
                                         that can: local): notice now, killed after ``notice_s``
                                         (0: SIGKILL at once); the controller drains and replaces it
- ``POST /admin/autoscale/scale``        ``{"instances": n | null, "duration_s"?, "reason"?, "pool"?}``
                                         (or ``?pool=``; both, differing: a 400):
                                         pin the count (null clears); each call is counted in
                                         ``llmserve:autoscale_manual_interventions_total``
- ``POST /admin/autoscale/retry``        (``?pool=``) a pool that gave up starting instances
                                         (its row's ``failed``: ``lifecycle.max_start_failures``
                                         in a row failed before getting ready) starts them again;
                                         a 409 for a pool that had not given up
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from llmserve.autoscale.capacity_actions import NoReclaim
from llmserve.autoscale.controller import PoolController
from llmserve.gateway.errors import GatewayError
from llmserve.lifecycle import InstanceState

# Engines with a process that answers: worth scraping (a stopping one is finishing its drain).
_SCRAPED = frozenset({InstanceState.WARMING, InstanceState.READY, InstanceState.DRAINING, InstanceState.STOPPING})


# At least one (limit=-1 answered an empty list, as if nothing had happened); unset: all.
_LIMIT = Query(None, ge=1)


class ScaleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instances: int | None = Field(ge=0)
    duration_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # Infinity: a pin that never ends
    reason: str = Field("manual scale", max_length=500)
    pool: str | None = None


def autoscale_router(controllers: Sequence[PoolController], guard: Callable[[Request], None]) -> APIRouter:
    r = APIRouter(prefix="/admin/autoscale", dependencies=[Depends(guard)])
    by_key = {c.key: c for c in controllers}

    def chosen(pool: str | None) -> list[PoolController]:
        if pool is None:
            return list(controllers)
        c = by_key.get(pool)
        if c is None:
            raise GatewayError(404, f"no controlled pool {pool!r}; pools: {sorted(by_key)}", code="pool_not_found")
        return [c]

    def one(pool: str | None) -> PoolController:
        cs = chosen(pool)
        if len(cs) != 1:
            raise GatewayError(400, f"name the pool (?pool=...): one of {sorted(by_key)}", code="pool_required")
        return cs[0]

    @r.get("/pools")
    async def pools(pool: str | None = None) -> dict:
        return {"pools": [c.describe() for c in chosen(pool)]}

    @r.get("/instances")
    async def instances(pool: str | None = None, finished: bool = True) -> dict:
        return {"instances": [{"pool": c.key, **i} for c in chosen(pool) for i in c.instance_views(finished)]}

    @r.get("/events")
    async def events(pool: str | None = None, since: int = 0, limit: int | None = _LIMIT) -> dict:
        return {"events": [{"pool": c.key, **e} for c in chosen(pool) for e in c.history.events(since, limit)]}

    @r.get("/decisions")
    async def decisions(pool: str | None = None, since: int = 0, limit: int | None = _LIMIT,
                        changes_only: bool = False) -> dict:
        return {"decisions": [{"pool": c.key, **d} for c in chosen(pool)
                              for d in c.history.decisions(since, limit, changes_only)]}

    @r.get("/timeline")
    async def timeline(pool: str | None = None, since: float = Query(0.0, allow_inf_nan=False),
                       limit: int | None = _LIMIT) -> dict:
        c = one(pool)
        return {"pool": c.key, "samples": c.history.samples(since, limit)}

    @r.get("/targets")
    async def targets() -> list[dict]:
        out = []
        for c in controllers:
            for i in c.instance_views(include_finished=False):
                if i["url"] and InstanceState(i["state"]) in _SCRAPED:
                    out.append({"targets": [urlsplit(i["url"]).netloc],
                                "labels": {"model": c.model, "version": c.version, "instance": i["instance_id"],
                                           "lifecycle_state": i["state"]}})
        return out

    @r.post("/instances/{instance_id}/reclaim")
    async def reclaim(instance_id: str, notice_s: float = Query(30.0, ge=0.0, le=3600.0),
                      pool: str | None = None) -> dict:
        c = next((c for c in chosen(pool) if instance_id in c.instances), None)
        if c is None:
            raise GatewayError(404, f"no live instance {instance_id!r}", code="instance_not_found")
        try:
            at = await c.reclaim(instance_id, notice_s)
        except NoReclaim as e:
            raise GatewayError(400, str(e), code="cannot_reclaim") from None
        return {"pool": c.key, "instance_id": instance_id, "reclaim_at": at, "notice_s": notice_s}

    @r.post("/scale")
    async def scale(body: ScaleBody, pool: str | None = None) -> dict:
        # The pool as the docs and the 400 below say (?pool=), or in the body; never two different ones.
        if pool is not None and body.pool is not None and pool != body.pool:
            raise GatewayError(400, f"two pools named: ?pool={pool!r} and the body's pool {body.pool!r}",
                               code="pool_conflict")
        c = one(pool if pool is not None else body.pool)
        try:
            c.set_override(body.instances, body.duration_s, body.reason)
        except ValueError as e:
            raise GatewayError(400, str(e), code="invalid_scale") from None
        return c.describe()

    @r.post("/retry")
    async def retry(pool: str | None = None) -> dict:
        c = one(pool)
        if not c.retry():
            raise GatewayError(409, f"pool {c.key} has not given up starting instances: nothing to retry",
                               code="pool_not_failed")
        return c.describe()

    return r
