"""Judging an instance on its way up from what a probe saw, purely; and the probe itself.

The controller looks at every starting or warming instance each probe interval:
is its process still there (the provider), and what does ``GET /ready`` say (the
engine's state word, read once into :class:`~llmserve.lifecycle.InstanceState` by
:meth:`~llmserve.lifecycle.InstanceState.from_wire`)? :func:`judge` turns that
into the next lifecycle state. Only ``/ready`` answering 200 makes an instance
ready, and the engine answers 200 only after its weights loaded and a warm-up
generation ran: a cold instance never gets traffic. Ready instances are looked at
too, less often: an engine that died under a live process says ``failed``, and is
failed (then replaced) at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol

import httpx

from llmserve.autoscale.providers.base import InstanceHandle, RunStatus
from llmserve.lifecycle import ALLOWED, InstanceState
from llmserve.load_report import LoadReport, MetricsLoadParser

S = InstanceState


@dataclass(frozen=True, slots=True)
class Probe:
    """One look at an instance: its process or actor, and its ``/ready`` answer."""

    run: RunStatus
    http_status: int | None = None  # None: no HTTP answer (not listening yet, or gone)
    engine_state: InstanceState | None = None  # what the engine says it is; None: it did not say
    error: str = ""


def judge(state: InstanceState, probe: Probe, age_s: float,
          start_timeout_s: float) -> tuple[InstanceState, str] | None:
    """The state ``probe`` moves an instance to, with the reason; None to stay.

    ``age_s`` is how long the instance has existed (its whole cold start so far).
    """
    if state in (S.STOPPING, S.STOPPED, S.FAILED):
        return None  # on its way out already: its exit is the stop's to record
    if probe.run.gone:
        what = probe.run.detail or probe.run.state.value
        return S.FAILED, f"{what} while {state.value}"
    if state is S.READY and probe.engine_state is S.FAILED:
        return S.FAILED, f"engine died while ready: {probe.error or 'see its log'}"
    if state not in (S.STARTING, S.WARMING):
        return None
    if probe.engine_state is S.FAILED:
        return S.FAILED, f"engine failed to start: {probe.error or 'see its log'}"
    if probe.http_status == 200:
        return S.READY, f"/ready answered 200 after {age_s:.1f}s (weights loaded, warm-up ran)"
    if state is S.STARTING and probe.engine_state is S.WARMING:
        return S.WARMING, f"weights loaded after {age_s:.1f}s; warm-up running"
    if age_s > start_timeout_s:
        return S.FAILED, f"not ready after {age_s:.0f}s (start timeout {start_timeout_s:g}s)"
    return None


def path(old: InstanceState, new: InstanceState) -> list[InstanceState]:
    """The states to pass through from ``old`` to ``new``: direct, or through one
    intermediate state (an engine that loaded and warmed up between two probes goes
    starting -> warming -> ready, so every transition is still recorded)."""
    if new in ALLOWED[old]:
        return [new]
    for mid in ALLOWED[old]:
        if new in ALLOWED[mid]:
            return [mid, new]
    raise ValueError(f"no path from {old.value} to {new.value}")


@dataclass(frozen=True, slots=True)
class EngineEndpoints:
    """Where an instance says it is ready and how loaded it is: ``llmserve engine``'s
    ``/ready`` and ``/load``, or a foreign server's (e.g. vLLM: ``/health`` and its
    Prometheus ``/metrics``, read with the gateway's own parser)."""

    ready_path: str = "/ready"
    load_source: Literal["load", "metrics"] = "load"


async def probe_ready(client: httpx.AsyncClient, url: str, run: RunStatus,
                      timeout_s: float, ready_path: str = "/ready", instance_id: str | None = None) -> Probe:
    """``GET /ready``: 200 when ready; 503 with the engine's state while loading or warming.
    A foreign server's ``ready_path`` counts only its status (refused while it starts).

    An engine that names itself as another instance is not this one: the port was free
    when it was chosen and another server took it first. That answer counts as none, so
    this instance never gets traffic meant for it (its own server fails to bind and exits)."""
    if run.gone:
        return Probe(run)
    try:
        r = await client.get(f"{url}{ready_path}", timeout=timeout_s)
    except httpx.HTTPError as e:
        return Probe(run, error=type(e).__name__)
    state, error = None, ""
    try:
        body = r.json()
        state = InstanceState.from_wire(body.get("state"))
        error = body.get("error") or ""
        other = body.get("instance_id")
    except (ValueError, AttributeError):
        other = None
    if instance_id and other and other != instance_id:
        return Probe(run, error=f"its port is answered by another instance ({other})")
    if state is S.FAILED and not error:
        try:
            error = (await client.get(f"{url}/health", timeout=timeout_s)).json().get("error") or ""
        except (httpx.HTTPError, ValueError):
            pass
    return Probe(run, r.status_code, state, error)


async def probe_load(client: httpx.AsyncClient, url: str, timeout_s: float) -> LoadReport | None:
    """The engine's own ``/load`` report; None when it does not answer."""
    try:
        r = await client.get(f"{url}/load", timeout=timeout_s)
        r.raise_for_status()
        return LoadReport.model_validate_json(r.content)
    except (httpx.HTTPError, ValueError):
        return None


class Prober(Protocol):
    """How the controller looks at an instance (HTTP by default; a fake in tests)."""

    async def ready(self, handle: InstanceHandle, run: RunStatus) -> Probe: ...

    async def load(self, handle: InstanceHandle) -> LoadReport | None: ...


class HttpProber:
    def __init__(self, client: httpx.AsyncClient, timeout_s: float,
                 endpoints: EngineEndpoints | None = None) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.endpoints = endpoints or EngineEndpoints()
        self._parsers: dict[str, MetricsLoadParser] = {}  # per instance: rates need the last scrape

    async def ready(self, handle: InstanceHandle, run: RunStatus) -> Probe:
        return await probe_ready(self.client, handle.url, run, self.timeout_s, self.endpoints.ready_path,
                                 handle.instance_id)

    async def load(self, handle: InstanceHandle) -> LoadReport | None:
        if self.endpoints.load_source == "load":
            return await probe_load(self.client, handle.url, self.timeout_s)
        parser = self._parsers.setdefault(handle.instance_id, MetricsLoadParser(handle.instance_id))
        try:
            r = await self.client.get(f"{handle.url}/metrics", timeout=self.timeout_s)
            r.raise_for_status()
            return parser.parse(r.text, time.time())
        except (httpx.HTTPError, ValueError):
            return None
