"""The server's own counts over the run, from its Prometheus ``/metrics``, to check ours.

A client can only report what it saw. Reading the server's counters just before
and just after the measured requests and taking the difference gives the
server's view of the same run (requests finished, prompt and generated tokens),
which catches a client that loses or double-counts tokens and a server whose
usage field disagrees with its own metrics. The deltas are only meaningful when
nothing else sends traffic to that server during the run.

Counter names are vLLM's, which llmserve's instance server also exports; a gateway
(``llmserve gateway`` / ``serve``) is read by its own counters instead (requests answered
200, tokens from the answers' usage; a stream's generated count is its data events).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from llmserve.load_report import parse_prometheus_text

SERVER_COUNTERS: dict[str, str] = {
    "request_success": "vllm:request_success",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
}


def default_metrics_url(api_root: str) -> str:
    """``http://h:p/v1`` → ``http://h:p/metrics`` (the API prefix dropped)."""
    parts = urlsplit(api_root)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))


GATEWAY_COUNTERS: dict[str, str] = {
    "request_success": "llmserve:gateway_requests",
    "prompt_tokens": "llmserve:gateway_prompt_tokens",
    "generation_tokens": "llmserve:gateway_generation_tokens",
}


def read_counters(text: str) -> dict[str, float]:
    """Each counter summed over its label sets; ``_total`` suffixes accepted, ``_created``
    ignored; a gateway's counters where there are no vLLM ones."""
    found = _read(text, SERVER_COUNTERS)
    return found or _read(text, GATEWAY_COUNTERS)


def _read(text: str, counters: dict[str, str]) -> dict[str, float]:
    out = {key: 0.0 for key in counters}
    seen: set[str] = set()
    names = {}
    for key, name in counters.items():
        names[name] = key
        names[name + "_total"] = key
    for name, labels, value in parse_prometheus_text(text):
        if name in names and labels.get("status", "200") == "200":  # (the gateway's requests: by status)
            out[names[name]] += value
            seen.add(names[name])
    return {k: v for k, v in out.items() if k in seen}


def counter_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if not before or not after:
        return {}
    return {k: after[k] - before[k] for k in SERVER_COUNTERS if k in before and k in after}


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float] | None:
    """The counters now, or None when the server has no readable ``/metrics``."""
    try:
        resp = await client.get(url, timeout=10.0)
    except (httpx.HTTPError, OSError):
        return None
    if resp.status_code != 200:
        return None
    return read_counters(resp.text)


def cross_check(deltas: dict[str, float], summary: Any) -> list[tuple[str, float, float | None]]:
    """(counter, server delta, the bench's own figure) for the table and tests."""
    ours = {
        "request_success": summary.completed,
        "prompt_tokens": summary.server_prompt_tokens,
        "generation_tokens": summary.total_output_tokens,
    }
    return [(k, v, ours[k]) for k, v in deltas.items()]
