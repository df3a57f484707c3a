"""An attempt's two LoRA steps (proxy and resume): the adapter onto the instance before
the request is sent, and an instance that answers it no longer has it.

A failed load releases the attempt's lease and is that attempt's failure (the instance
is tried no more for this request); against its health only when the instance failed
(5xx, a broken connection), not when it refused the adapter (4xx). A 404 for the
adapter's name means the engine dropped it since the gateway last knew (least
recently used out of ``--max-cpu-loras``): the attempt is retried, and the adapter is
loaded again wherever the retry lands.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from llmserve.api.errors import APIError
from llmserve.gateway.adapter_load import AdapterLoadFailed, ensure_adapter
from llmserve.gateway.pool import Lease, Outcome, Pool

if TYPE_CHECKING:
    from llmserve.gateway.config import AdapterConfig
    from llmserve.gateway.upstream import UpstreamClient, UpstreamResponse


class Plan(Protocol):
    pool: Pool
    headers: dict[str, str]
    tried: list[str]
    adapter: AdapterConfig | None


async def adapter_ready(client: UpstreamClient, plan: Plan, lease: Lease) -> APIError | None:
    """None once the plan's adapter is on the lease's instance; else why not (the lease released)."""
    assert plan.adapter is not None
    try:
        await ensure_adapter(client, lease.instance, plan.adapter, plan.headers)
    except AdapterLoadFailed as e:
        plan.pool.release(lease, Outcome.FAILURE if e.instance_fault else Outcome.NEUTRAL)
        plan.tried.append(lease.instance.instance_id)
        return e.error
    except BaseException:
        plan.pool.release(lease, Outcome.NEUTRAL)
        raise
    return None


async def adapter_gone(plan: Plan, lease: Lease, resp: UpstreamResponse) -> APIError | None:
    """For a 404 naming the model on an adapter request: the instance has it no more. The
    response is read and closed and the lease released; the error stands for the attempt.
    None (the response untouched) for any other answer."""
    if plan.adapter is None or resp.status_code != 404:
        return None
    try:
        body = await resp.aread()
    finally:
        await resp.aclose()
    plan.pool.release(lease, Outcome.NEUTRAL)
    inst = lease.instance
    if b"model_not_found" in body[:4096]:
        inst.residency.gone(plan.adapter.name, time.monotonic())
    return APIError(502, f"instance {inst.instance_id} no longer has adapter {plan.adapter.name!r}",
                    code="adapter_not_resident")
