"""What the gateway's ``GET /v1/models`` says of each model: its public name, and the facts
of the weights behind it (``max_model_len``, ``family``, ``context_length``) as its instances
report them on their own ``/v1/models``.

The gateway holds names and URLs only, so each model's facts are asked of a ready instance
(its versions in config order; the next if one cannot say, ``ASKED`` at most) and kept
``ttl_s``; when none can say they are null rather than failing the list. A llama.cpp instance
reports its training context as ``meta.n_ctx_train``: that is its ``context_length``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from llmserve.gateway.runtime import Gateway, ModelRuntime

log = logging.getLogger(__name__)

FACT_KEYS = ("max_model_len", "family", "context_length")
ASKED = 2  # instances asked per model and list: hung ones cost a list at most this many poll timeouts


def facts_of(body: bytes, upstream_model: str) -> dict[str, Any] | None:
    """The facts ``upstream_model`` has in an instance's ``/v1/models`` body (its entry, else
    the list's first); None when the body is not such a list."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return None
    entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
    if not entries:
        return None
    entry = next((e for e in entries if e.get("id") == upstream_model), entries[0])
    facts = {k: entry.get(k) for k in FACT_KEYS}
    meta = entry.get("meta")
    if facts["context_length"] is None and isinstance(meta, dict):
        facts["context_length"] = meta.get("n_ctx_train")
    return {k: v if isinstance(v, (str, int)) and not isinstance(v, bool) else None for k, v in facts.items()}


class ModelCards:
    def __init__(self, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self.created = int(time.time())
        self._facts: dict[str, tuple[float, dict[str, Any]]] = {}

    async def cards(self, gw: Gateway) -> list[dict[str, Any]]:
        out = []
        for name, rt in gw.models.items():
            facts = await self._facts_for(gw, rt)
            out.append({"id": name, "object": "model", "created": self.created, "owned_by": "llmserve",
                        "root": name, "parent": None, **facts})
            for alias, version in rt.config.aliases.items():  # (vLLM lists an adapter with its base as parent;
                # with aliases every version's upstream model is named: runtime.py)
                out.append({"id": alias, "object": "model", "created": self.created, "owned_by": "llmserve",
                            "root": rt.upstream_models[version], "parent": name, **facts})
        return out

    async def _facts_for(self, gw: Gateway, rt: ModelRuntime) -> dict[str, Any]:
        now = self.clock()
        kept = self._facts.get(rt.name)
        if kept is not None and now - kept[0] < self.ttl_s:
            return kept[1]
        ready = [(v, i) for v, pool in rt.pools.items() for i in pool.instances() if i.ready]
        for version, inst in ready[:ASKED] if gw.upstream is not None else []:
            auth = rt.upstream_auth[version]
            try:
                status, body = await gw.upstream.get(f"{inst.url}/v1/models", timeout=gw.config.polling.timeout_s,
                                                     headers={"authorization": auth} if auth else None)
            except httpx.HTTPError as e:
                log.debug("model facts: %s did not answer (%s)", inst.instance_id, e)
                continue
            facts = facts_of(body, rt.upstream_models[version] or rt.name) if status == 200 else None
            if facts is not None:
                self._facts[rt.name] = (now, facts)
                return facts
        return dict.fromkeys(FACT_KEYS)  # (not kept: asked again on the next list)
