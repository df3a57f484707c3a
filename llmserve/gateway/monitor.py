"""Polls every instance: ``/load`` each ``load_interval_s`` and ``/ready`` each
``ready_interval_s``.

An upstream without ``/load`` (404) is read through its Prometheus ``/metrics``
instead; one without ``/ready`` is checked on ``/health``. At most one poll of each
kind is in flight per instance, so a slow instance never delays the others. A
refused connection marks the instance not ready at once, so a dead instance stops
getting traffic within one load interval, long before the breaker would trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import httpx

from llmserve.gateway.config import PollingConfig
from llmserve.gateway.pool import Pool, Upstream
from llmserve.gateway.upstream import UpstreamClient
from llmserve.load_report import LoadReport, MetricsLoadParser

log = logging.getLogger(__name__)


class Monitor:
    def __init__(self, pools: Callable[[], Iterable[Pool]], client: UpstreamClient,
                 config: PollingConfig) -> None:
        self._pools = pools
        self._client = client
        self.config = config
        self._load_tasks: dict[int, asyncio.Task] = {}
        self._ready_tasks: dict[int, asyncio.Task] = {}
        self._last_ready: dict[int, float] = {}

    async def run(self) -> None:
        while True:
            self.tick(time.monotonic())
            await asyncio.sleep(self.config.load_interval_s)

    def tick(self, now: float) -> None:
        """Start the polls that are due."""
        live: set[int] = set()
        for pool in self._pools():
            for inst in pool.instances():
                key = id(inst)
                live.add(key)
                if key not in self._load_tasks or self._load_tasks[key].done():
                    self._load_tasks[key] = asyncio.create_task(self.poll_load(pool, inst))
                due = now - self._last_ready.get(key, -1e18) >= self.config.ready_interval_s
                if due and (key not in self._ready_tasks or self._ready_tasks[key].done()):
                    self._last_ready[key] = now
                    self._ready_tasks[key] = asyncio.create_task(self.check_ready(pool, inst))
        for tasks in (self._load_tasks, self._ready_tasks):
            for key in [k for k in tasks if k not in live]:
                tasks.pop(key).cancel()
        for key in [k for k in self._last_ready if k not in live]:
            del self._last_ready[key]

    def close(self) -> None:
        for tasks in (self._load_tasks, self._ready_tasks):
            for t in tasks.values():
                t.cancel()
            tasks.clear()

    async def poll_load(self, pool: Pool, inst: Upstream) -> None:
        inflight_at_send, asked_at = inst.inflight, time.monotonic()
        try:
            report = await self._fetch_load(inst)
        except (httpx.HTTPError, ValueError) as e:
            inst.poll_failures += 1
            if isinstance(e, httpx.ConnectError) or inst.poll_failures >= 3:
                if inst.ready:
                    log.warning("instance %s unreachable (%s): not ready", inst.instance_id, e)
                pool.set_ready(inst, False)
            return
        inst.poll_failures = 0
        inst.report = report
        inst.inflight_at_report = inflight_at_send
        inst.report_at, inst.report_asked_at = time.monotonic(), asked_at
        pool.pump()

    async def _fetch_load(self, inst: Upstream) -> LoadReport:
        timeout = self.config.timeout_s
        if inst.load_source == "load":
            status, body = await self._client.get(f"{inst.url}/load", timeout=timeout)
            if status not in (404, 405):
                _check(status, inst, "/load")
                return LoadReport.model_validate_json(body)
            inst.load_source = "metrics"
            inst.metrics_parser = MetricsLoadParser(inst.instance_id)
            log.info("instance %s has no /load; reading /metrics", inst.instance_id)
        status, body = await self._client.get(f"{inst.url}/metrics", timeout=timeout)
        _check(status, inst, "/metrics")
        assert inst.metrics_parser is not None
        return inst.metrics_parser.parse(body.decode("utf-8", "replace"), time.time())

    async def check_ready(self, pool: Pool, inst: Upstream) -> None:
        try:
            status, _ = await self._client.get(f"{inst.url}{inst.ready_path}",
                                               timeout=self.config.timeout_s)
            if status == 404 and inst.ready_path == "/ready":
                inst.ready_path = "/health"
                status, _ = await self._client.get(f"{inst.url}/health",
                                                   timeout=self.config.timeout_s)
            ready = status == 200
        except httpx.HTTPError:
            ready = False
        if ready != inst.ready:
            log.info("instance %s is %s", inst.instance_id, "ready" if ready else "not ready")
        pool.set_ready(inst, ready)


def _check(status: int, inst: Upstream, path: str) -> None:
    if status >= 400:
        raise httpx.HTTPError(f"{path} of {inst.instance_id} answered {status}")
