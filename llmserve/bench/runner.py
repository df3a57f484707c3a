"""Drives a run: sends each request at its planned offset, within the concurrency cap.

The runner owns the clock. Offsets (from ``arrivals.py``) are waited for against
one start time, a request also waits for a free slot under ``--max-concurrency``
and for the request it depends on (the previous turn of its conversation), and the
measured duration runs from the first scheduled send to the last completion, as in
vLLM's bench. Warm-up requests go first and are not part of any figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import httpx
from tqdm.auto import tqdm

from llmserve.bench.client import EndpointConfig, make_http_client, send_request
from llmserve.bench.datasets import SampleRequest
from llmserve.bench.records import OutputCountSource, RequestRecord
from llmserve.bench.server_metrics import counter_deltas, scrape
from llmserve.bench.tokenizer import Tokenizer


@dataclass(slots=True)
class RunOutcome:
    records: list[RequestRecord]
    duration_s: float
    warmup_records: list[RequestRecord]
    server_deltas: dict[str, float] = field(default_factory=dict)
    origin_wall: float = 0.0  # time.time() at the measured run's offset 0 (to line records up with server logs)


def _recount_output(rec: RequestRecord, tok: Tokenizer | None) -> None:
    """Without usage, re-tokenize the text (as vLLM does) when the tokenizer is exact."""
    if rec.success and rec.output_source is OutputCountSource.CHUNKS and tok is not None and tok.exact:
        rec.output_tokens = len(tok.encode(rec.generated_text))
        rec.output_source = OutputCountSource.TOKENIZER


async def _send_all(
    client: httpx.AsyncClient,
    cfg: EndpointConfig,
    requests: Sequence[SampleRequest],
    offsets: Sequence[float],
    max_concurrency: int | None,
    progress: tqdm | None,
) -> tuple[list[RequestRecord], float, float]:
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    finished = [asyncio.Event() for _ in requests]
    records: list[RequestRecord | None] = [None] * len(requests)
    origin, origin_wall = time.perf_counter(), time.time()

    async def one(i: int) -> None:
        try:
            delay = offsets[i] - (time.perf_counter() - origin)
            if delay > 0:
                await asyncio.sleep(delay)
            dep = requests[i].depends_on
            if dep is not None and dep < len(requests):
                await finished[dep].wait()
            async with slots if slots else contextlib.nullcontext():
                records[i] = await send_request(client, cfg, requests[i], i, origin, float(offsets[i]))
        finally:
            finished[i].set()
            if progress is not None:
                progress.update(1)

    await asyncio.gather(*(one(i) for i in range(len(requests))))
    duration = time.perf_counter() - origin
    return [r for r in records if r is not None], duration, origin_wall


async def _prime(client: httpx.AsyncClient, cfg: EndpointConfig) -> None:
    """One untimed ``GET /models`` before the clock starts.

    httpx loads its connection machinery lazily on the first request (about 0.1 s),
    which would otherwise be charged to the first requests' TTFT. Any answer, or
    none, is fine: failures are for the measured requests to report.
    """
    with contextlib.suppress(httpx.HTTPError, OSError):
        await client.get(cfg.api_root + "/models", headers=cfg.headers, timeout=10.0)


async def run_requests(
    cfg: EndpointConfig,
    requests: Sequence[SampleRequest],
    offsets: Sequence[float],
    max_concurrency: int | None = None,
    warmups: Sequence[SampleRequest] = (),
    tokenizer: Tokenizer | None = None,
    show_progress: bool = True,
    metrics_url: str | None = None,
) -> RunOutcome:
    """Send ``requests[i]`` at ``offsets[i]`` seconds; requests beyond ``offsets`` are not sent.

    ``warmups`` are sent together (within the cap) before the clock starts, without
    dependencies; they should not share prompts with ``requests``, or the measured
    requests would find their prompts already in the server's prefix cache. With ``metrics_url`` the server's
    counters are read after the warm-ups and after the run (see ``server_metrics``).
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max concurrency must be >= 1, got {max_concurrency}")
    requests = list(requests[: len(offsets)])
    async with make_http_client(max_concurrency) as client:
        await _prime(client, cfg)
        warm: list[RequestRecord] = []
        if warmups:
            warm_reqs = [replace(r, depends_on=None) for r in warmups]
            warm, _, _ = await _send_all(client, cfg, warm_reqs, [0.0] * len(warm_reqs), max_concurrency, None)
        before = await scrape(client, metrics_url) if metrics_url else None
        bar = tqdm(total=len(requests), desc="requests", unit="req", disable=not show_progress)
        try:
            records, duration, origin_wall = await _send_all(client, cfg, requests, offsets, max_concurrency, bar)
        finally:
            bar.close()
        after = await scrape(client, metrics_url) if metrics_url else None
    for r in records:
        _recount_output(r, tokenizer)
    return RunOutcome(records, duration, warm, counter_deltas(before, after), origin_wall)
