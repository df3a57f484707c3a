"""``prefix``: send a prompt to the instance that recently served the same prefix.

The prompt's leading characters are cut into blocks of ``block_chars`` and hashed
as a chain (block k's hash covers blocks 0..k), so one hash stands for a whole
prefix. A bounded LRU table maps each chain hash to the instance that last
served it. An instance scores the share of the prompt's blocks whose longest
recorded prefix points to it, so a longer shared prefix scores higher.

The imbalance guard: a hot prefix (one system prompt shared by every request)
would otherwise pin all traffic to one instance. Affinity is ignored (score 0)
for an instance whose load exceeds the least-loaded candidate's by more than
``max(imbalance_abs, imbalance_ratio * least)``; the other scorers then spread
the load, and the table follows the new instance as it serves the prefix.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from llmserve.gateway.balancer.base import RouteRequest
from llmserve.gateway.instance import InstanceView


class PrefixConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    block_chars: int = Field(64, ge=1)  # about 16 tokens, an engine KV block
    max_blocks: int = Field(64, ge=1)  # only the leading max_blocks * block_chars count
    table_size: int = Field(100_000, ge=1)
    imbalance_abs: int = Field(8, ge=0)
    imbalance_ratio: float = Field(0.5, ge=0.0)


def prefix_hashes(text: str, block_chars: int, max_blocks: int) -> list[bytes]:
    """Chain hashes of the full leading blocks (a partial last block is not hashed)."""
    out: list[bytes] = []
    n = min(len(text) // block_chars, max_blocks)
    h = hashlib.blake2b(digest_size=12)
    for k in range(n):  # one running hash over the prefix: block k's digest covers blocks 0..k
        h.update(text[k * block_chars:(k + 1) * block_chars].encode())
        out.append(h.copy().digest())
    return out


class PrefixAffinityScorer:
    name = "prefix"

    def __init__(self, config: PrefixConfig | None = None) -> None:
        self.config = config or PrefixConfig()
        self._table: OrderedDict[bytes, str] = OrderedDict()
        self.hits = 0  # picks that went where the prompt's first block was recorded
        self._last: tuple[str | None, list[bytes]] = (None, [])

    def __len__(self) -> int:
        return len(self._table)

    def matched_blocks(self, request: RouteRequest) -> tuple[dict[str, int], int]:
        """Per instance id, the longest recorded prefix (in blocks); and the block count."""
        hashes = self._hashes(request)
        best: dict[str, int] = {}
        for k, h in enumerate(hashes, start=1):
            owner = self._table.get(h)
            if owner is not None:
                best[owner] = k
        return best, len(hashes)

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        if not candidates:
            return []
        matched, n = self.matched_blocks(request)
        if n == 0 or not matched:
            return [0.0] * len(candidates)
        least = min(c.est_load for c in candidates)
        limit = least + max(self.config.imbalance_abs, self.config.imbalance_ratio * least)
        return [0.0 if c.est_load > limit else matched.get(c.instance_id, 0) / n
                for c in candidates]

    def on_picked(self, request: RouteRequest, instance: InstanceView) -> None:
        hashes = self._hashes(request)
        if not hashes:  # a prompt shorter than a block: nothing to record
            return
        if any(self._table.get(h) == instance.instance_id for h in hashes[:1]):
            self.hits += 1
        for h in hashes:
            self._table[h] = instance.instance_id
            self._table.move_to_end(h)
        while len(self._table) > self.config.table_size:
            self._table.popitem(last=False)

    def forget(self, instance_id: str) -> None:
        """Drop an instance that left the pool."""
        for h in [h for h, owner in self._table.items() if owner == instance_id]:
            del self._table[h]

    def _hashes(self, request: RouteRequest) -> list[bytes]:
        # A pick asks twice (score, then on_picked) for the same request: hash once.
        if request.prefix_text is not self._last[0]:
            self._last = (request.prefix_text,
                          prefix_hashes(request.prefix_text, self.config.block_chars, self.config.max_blocks))
        return self._last[1]
