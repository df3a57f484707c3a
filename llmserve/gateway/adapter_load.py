"""Putting a LoRA adapter on an instance: what this gateway knows of residency, and the load.

An instance's ``/load`` report lists its resident adapters (``lora_adapters``),
but it is up to a poll old. :class:`Residency` (one per upstream, owned by its
pool) adds what this gateway did since: an adapter it loaded after that poll was
asked for, and one it is loading or has just picked the instance to load (a
*claim*), so requests for the same adapter follow the first one onto that
instance and wait for its one load instead of each loading it somewhere else.
A report asked for after a load finished is the truth again (the engine may
have evicted the adapter since; then the next request loads it anew). An
instance that answers 404 for the adapter (it evicted it after the report) has
it no more until a report asked for after that answer says otherwise.

:func:`ensure_adapter` is the request path's step between getting a slot and
sending: nothing when the adapter is resident, else one ``POST
/v1/load_lora_adapter`` (vLLM's API) shared by every request waiting for it.
A failed load is the attempt's failure: the proxy tries another instance.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import httpx

from llmserve.gateway.config import AdapterConfig
from llmserve.api.errors import APIError
from llmserve.load_report import LoadReport

CLAIM_TTL_S = 30.0  # a claim nobody followed (its client left before the load began)
LOAD_PATH = "/v1/load_lora_adapter"


class Residency:
    """The adapters this gateway knows to be on one instance beyond its last report."""

    __slots__ = ("_claims", "_gone", "_loaded", "_loads")

    def __init__(self) -> None:
        self._loaded: dict[str, float] = {}  # name -> monotonic time its load finished
        self._claims: dict[str, float] = {}  # name -> when it was picked to be loaded here
        self._loads: dict[str, asyncio.Future[None]] = {}
        self._gone: dict[str, float] = {}  # name -> when the instance said it lacks it (404)

    def view(self, report: LoadReport | None, asked_at: float, now: float) -> tuple[frozenset[str], frozenset[str]]:
        """(resident, loaded) as routing should know them: the report's (less what the
        instance denied since), and ours since it was asked for, as loaded."""
        resident, loaded = reported(report)
        if not (self._loaded or self._claims or self._loads or self._gone):
            return frozenset(resident), frozenset(loaded)
        self._loaded = {n: t for n, t in self._loaded.items() if t >= asked_at}
        self._claims = {n: t for n, t in self._claims.items() if now - t < CLAIM_TTL_S}
        self._gone = {n: t for n, t in self._gone.items() if t >= asked_at}
        ours = frozenset(loaded).union(self._loaded, self._claims, self._loads)
        return frozenset(resident).difference(self._gone), ours.difference(self._gone).union(self._loads)

    def gone(self, name: str, now: float) -> None:
        """The instance answered that it lacks ``name``: load it again before the next request."""
        self._loaded.pop(name, None)
        self._gone[name] = now

    def claim(self, name: str, now: float) -> None:
        """The picker chose this instance to load ``name`` (its request is on the way)."""
        self._claims.setdefault(name, now)

    async def ensure(self, name: str, resident: bool, load: Callable[[], Awaitable[None]]) -> None:
        """Return once ``name`` is loaded here: at once if ``resident``, else after the
        one shared load (started now if none runs); raises what the load raised."""
        if (resident and name not in self._gone) or name in self._loaded:
            return
        fut = self._loads.get(name)
        if fut is None:
            fut = self._loads[name] = asyncio.ensure_future(self._run(name, load))
        await asyncio.shield(fut)  # one waiter leaving must not cancel the others' load

    async def _run(self, name: str, load: Callable[[], Awaitable[None]]) -> None:
        try:
            await load()
            self._loaded[name] = time.monotonic()
            self._gone.pop(name, None)
        finally:
            del self._loads[name]
            self._claims.pop(name, None)


class AdapterLoadFailed(Exception):
    def __init__(self, error: APIError, instance_fault: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.instance_fault = instance_fault  # counts against the instance's health


class _Poster(Protocol):
    async def post(self, url: str, content: bytes, headers: dict[str, str], *,
                   abandon: asyncio.Future | None = None): ...


class Instance(Protocol):
    """What loading reads of an upstream (``pool.Upstream`` is one)."""

    instance_id: str
    url: str
    residency: Residency
    report: LoadReport | None
    report_asked_at: float


def reported(report: LoadReport | None) -> tuple[list[str], list[str]]:
    """A report's resident adapters (in a slot) and those loaded in memory only."""
    return (report.lora_adapters, report.lora_adapters_loaded) if report is not None else ([], [])


def adapters_of(inst: Instance) -> tuple[frozenset[str], frozenset[str]]:
    """(resident, loaded) adapters of ``inst`` as far as this gateway knows (its last report and our loads since)."""
    return inst.residency.view(inst.report, inst.report_asked_at, time.monotonic())


async def ensure_adapter(client: _Poster, inst: Instance, adapter: AdapterConfig, headers: dict[str, str]) -> None:
    """Load ``adapter`` on ``inst`` unless it is there; raises :class:`AdapterLoadFailed`."""
    # (registered but evicted: the instance reads it again itself, path or no path here)
    there = any(adapter.name in names for names in reported(inst.report)) or (
        inst.report is not None and adapter.name in inst.report.lora_adapters_registered)

    async def load() -> None:
        await _load(client, inst, adapter, headers)
    try:
        await inst.residency.ensure(adapter.name, there, load)
    except httpx.HTTPError as e:
        raise AdapterLoadFailed(APIError(502, f"loading adapter {adapter.name!r} on {inst.instance_id} "
                                              f"failed: {type(e).__name__}: {e}", code="adapter_load_failed"),
                                True) from None


async def _load(client: _Poster, target: Instance, adapter: AdapterConfig, headers: dict[str, str]) -> None:
    where = f"adapter {adapter.name!r} is not on {target.instance_id}"
    if adapter.path is None:
        raise AdapterLoadFailed(APIError(502, f"{where} and has no path to load it from",
                                         code="adapter_not_resident"), False)
    body = json.dumps({"lora_name": adapter.name, "lora_path": adapter.path}).encode()
    sent = {k: v for k, v in headers.items() if k in ("authorization", "x-request-id", "traceparent")}
    resp = await client.post(f"{target.url}{LOAD_PATH}", body, {"content-type": "application/json", **sent})
    try:
        answer = await resp.aread()
    finally:
        await resp.aclose()
    if resp.status_code == 200 or (resp.status_code == 400 and b"already" in answer):
        return  # loaded, or loaded already (by another gateway, or before our report)
    raise AdapterLoadFailed(APIError(502, f"loading adapter {adapter.name!r} on {target.instance_id}: "
                                          f"{resp.status_code} {_message(answer)}", code="adapter_load_failed"),
                            resp.status_code >= 500)


def _message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error", {})
        return str(err.get("message", "")) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")
