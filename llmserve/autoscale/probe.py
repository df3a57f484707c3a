"""Judging an instance on its way up from what a probe saw, purely; and the probe itself.

The controller looks at every starting or warming instance each probe interval:
is its process still there (the provider), and what does ``GET /ready`` say (the
engine: ``loading``, ``warming``, ``ready``, ``failed``)? :func:`judge` turns that
into the next lifecycle state. Only ``/ready`` answering 200 makes an instance
ready, and the engine answers 200 only after its weights loaded and a warm-up
generation ran: a cold instance never gets traffic. Ready instances are looked at
too, less often: an engine that died under a live process says ``failed``, and is
failed (then replaced) at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import httpx

from llmserve.autoscale.lifecycle import ALLOWED, InstanceState
from llmserve.autoscale.providers.base import InstanceHandle, RunStatus
from llmserve.load_report import LoadReport

S = InstanceState


@dataclass(frozen=True, slots=True)
class Probe:
    """One look at an instance: its process or actor, and its ``/ready`` answer."""

    run: RunStatus
    http_status: int | None = None  # None: no HTTP answer (not listening yet, or gone)
    engine_state: str | None = None  # the engine's own word: loading, warming, ready, draining, failed
    error: str = ""


def judge(state: InstanceState, probe: Probe, age_s: float,
          start_timeout_s: float) -> tuple[InstanceState, str] | None:
    """The state ``probe`` moves an instance to, with the reason; None to stay.

    ``age_s`` is how long the instance has existed (its whole cold start so far).
    """
    if state in (S.STOPPED, S.FAILED):
        return None
    if probe.run.gone:
        what = probe.run.detail or probe.run.state.value
        return S.FAILED, f"{what} while {state.value}"
    if state is S.READY and probe.engine_state == "failed":
        return S.FAILED, f"engine died while ready: {probe.error or 'see its log'}"
    if state not in (S.STARTING, S.WARMING):
        return None
    if probe.engine_state == "failed":
        return S.FAILED, f"engine failed to start: {probe.error or 'see its log'}"
    if probe.http_status == 200:
        return S.READY, f"/ready answered 200 after {age_s:.1f}s (weights loaded, warm-up ran)"
    if state is S.STARTING and probe.engine_state == "warming":
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


async def probe_ready(client: httpx.AsyncClient, url: str, run: RunStatus,
                      timeout_s: float) -> Probe:
    """``GET /ready``: 200 when ready; 503 with the engine's state while loading or warming."""
    if run.gone:
        return Probe(run)
    try:
        r = await client.get(f"{url}/ready", timeout=timeout_s)
    except httpx.HTTPError as e:
        return Probe(run, error=type(e).__name__)
    state, error = None, ""
    try:
        body = r.json()
        state = body.get("state")
        error = body.get("error") or ""
    except ValueError:
        pass
    if state == "failed" and not error:
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
    def __init__(self, client: httpx.AsyncClient, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s

    async def ready(self, handle: InstanceHandle, run: RunStatus) -> Probe:
        return await probe_ready(self.client, handle.url, run, self.timeout_s)

    async def load(self, handle: InstanceHandle) -> LoadReport | None:
        return await probe_load(self.client, handle.url, self.timeout_s)
