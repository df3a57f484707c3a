"""``GET /admin/keys/{key}/usage``: what a named key has used, behind the admin key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends

from llmserve.gateway.admin import admin_guard

if TYPE_CHECKING:
    from llmserve.gateway.runtime import Gateway


def keys_router(gw: Gateway) -> APIRouter:
    """``GET /admin/keys/{key}/usage`` behind the admin key."""
    r = APIRouter(prefix="/admin", dependencies=[Depends(admin_guard(gw))])

    @r.get("/keys/{key}/usage")
    async def usage(key: str) -> dict:
        return await gw.tenants.report(key)

    return r
