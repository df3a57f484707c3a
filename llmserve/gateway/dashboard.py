"""The live dashboard: one self-contained HTML page and the JSON it polls.

``GET /dashboard`` serves the page (static, no secrets, nothing fetched from
elsewhere: the charts are inline SVG). The page reads the admin key from the URL
fragment (``/dashboard#key=...``, which browsers never send to the server) and
polls ``GET /admin/dashboard/data`` with it about once a second. The data is
the gateway's own view (models, versions, weights, canary status, pools) plus
whatever each gateway service that is a :class:`DashboardSource` adds (the
elastic controller: instances by state, signals over time, events, decisions).
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse

from llmserve.gateway.admin import admin_guard

if TYPE_CHECKING:
    from llmserve.gateway.runtime import Gateway

PAGE = Path(__file__).parent / "static" / "dashboard.html"
TIMELINE_S = 600.0  # the dashboard's window on each model's timeline; the admin API has it all


@runtime_checkable
class DashboardSource(Protocol):
    def dashboard(self) -> dict[str, Any]: ...


@lru_cache(maxsize=1)
def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def dashboard_data(gw: Gateway) -> dict[str, Any]:
    return {
        "time": time.time(),
        "models": [rt.describe() for rt in gw.models.values()],
        "pools": [rt.describe_pool(v) for rt in gw.models.values() for v in rt.pools],
        "autoscale": [s.dashboard() for s in gw.services if isinstance(s, DashboardSource)],
        "timelines": [gw.model_timeline(name, time.time() - TIMELINE_S, 600) for name in gw.models],
    }


def dashboard_router(gw: Gateway) -> APIRouter:
    r = APIRouter()

    @r.get("/dashboard", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(_page(), headers={"cache-control": "no-store"})

    @r.get("/admin/dashboard/data", dependencies=[Depends(admin_guard(gw))])
    async def data() -> dict[str, Any]:
        return dashboard_data(gw)

    return r
