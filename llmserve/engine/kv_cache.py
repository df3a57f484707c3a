"""KV cache manager: block tables per request, prefix reuse and the admission check.

The scheduler asks this manager for slots and never sees a reference count. Block
ids here index the runner's paged KV tensors: token ``t`` of a request lives at
slot ``block_table[t // block_size] * block_size + t % block_size``.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from dataclasses import dataclass, field

from llmserve.engine.block_pool import BlockPool, KVBlock
from llmserve.engine.request import Request


def hash_block(parent: bytes | None, token_ids: list[int], extra: bytes) -> bytes:
    """Content hash of one full block, chained with its parent's hash.

    SHA-256 rather than Python's ``hash``: a collision would hand one tenant another
    tenant's KV, so the hash must not be forgeable.
    """
    h = hashlib.sha256(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    h.update(extra)
    return h.digest()


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The shape of a paged KV pool, for a second pool that mirrors it (a draft model's)."""

    num_blocks: int
    block_size: int


# Stands in a block table for a block freed because it left every layer's sliding window:
# positions stay aligned, and attention masks those keys (reading block 0 there is harmless).
_FREED = KVBlock(0)


@dataclass
class _ReqBlocks:
    blocks: list[KVBlock] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)  # hashes of the request's full blocks
    num_registered: int = 0  # leading blocks registered in the prefix cache
    num_freed: int = 0  # leading blocks freed outside the sliding window (``_FREED`` in ``blocks``)


class KVCacheManager:
    """Owns every block reference of every request.

    ``watermark_blocks`` stay free when admitting a new request, so requests that
    are already running can grow a little before anything must be preempted.

    ``sliding_window``: the window of every layer, when all of them slide (Mistral): a
    request's blocks whose keys no future query can see are freed as it advances, as
    vLLM's sliding-window manager does. Registered in the prefix cache first, they stay
    reusable until evicted. ``step_tokens``: the most tokens one step adds to a request.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 watermark: float = 0.01, model_key: str = "", sliding_window: int | None = None,
                 step_tokens: int = 0) -> None:
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = max(1, int(watermark * num_blocks)) if num_blocks > 8 else 0
        self._model_key = model_key.encode()
        self.sliding_window = sliding_window
        # with every layer sliding, a request holds at most its window, a step's tokens and two
        # partial blocks: when the pool has that room, it bounds no request's length
        held = (sliding_window or 0) + step_tokens + 4 * block_size
        self.token_capacity = sys.maxsize if sliding_window and num_blocks * block_size >= held \
            else num_blocks * block_size
        self._reqs: dict[str, _ReqBlocks] = {}
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found

    # ---- queries -------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def geometry(self) -> KVGeometry:
        return KVGeometry(self.num_blocks, self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        """Share of blocks referenced by a request (cached-but-idle blocks count as free)."""
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def block_ids(self, request_id: str) -> list[int]:
        rb = self._reqs.get(request_id)
        return [b.block_id for b in rb.blocks] if rb else []

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix reuse ---------------------------------------------------------
    def _extra(self, request: Request) -> bytes:
        # surrogatepass: a lone surrogate (JSON allows "\ud800") must not make hashing raise;
        # it is still one-to-one, so distinct salts keep distinct caches.
        salt = request.cache_salt.encode("utf-8", "surrogatepass") if request.cache_salt else b""
        # the adapter's load id: one prompt under two adapters (or two loads of one name) never shares KV
        lora = b"\x00lora%d" % request.lora_id if request.lora_id else b""
        return self._model_key + lora + b"\x00" + salt

    def _full_block_hashes(self, request: Request, upto_tokens: int, known: list[bytes]) -> list[bytes]:
        """Hashes of the full blocks among the first ``upto_tokens`` tokens, extending ``known``."""
        bs, extra = self.block_size, self._extra(request)
        hashes = list(known)
        toks = request.all_token_ids
        for i in range(len(hashes), upto_tokens // bs):
            hashes.append(hash_block(hashes[-1] if hashes else None, toks[i * bs:(i + 1) * bs], extra))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest chain of cached blocks for a request not yet holding any blocks.

        At most ``num_tokens - 1`` tokens can hit, so the last token is always computed
        and yields logits.
        """
        if not self.enable_prefix_caching:
            return [], 0
        limit = request.num_tokens - 1
        hashes = self._full_block_hashes(request, limit, [])
        hits: list[KVBlock] = []
        for h in hashes:
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit: int) -> None:
        """Count one admitted request's lookup (vLLM's prefix_cache_queries / hits)."""
        if self.enable_prefix_caching:
            self.prefix_queries += num_tokens
            self.prefix_hits += num_hit

    # ---- allocation -------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int, *,
                       new_computed_blocks: list[KVBlock] | None = None,
                       admitting: bool = False) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed ones.

        ``new_computed_blocks`` are prefix-cache hits for a request being admitted.
        Returns False (and changes nothing) when the pool cannot supply the blocks.
        """
        rb = self._reqs.get(request.request_id)
        held = len(rb.blocks) if rb else 0
        hits = new_computed_blocks or []
        total_tokens = request.num_computed_tokens + num_new_tokens
        need_new = max(0, self.blocks_needed(total_tokens) - held - len(hits))
        # Cache hits sitting in the free queue stop being free once touched.
        hits_from_free = sum(1 for b in hits if b.ref_cnt == 0)
        # The watermark lets running requests grow; with none running it protects no one,
        # and would keep a request that needs the whole pool (allowed: it fits
        # max_model_len) waiting forever on an idle engine.
        reserve = self.watermark_blocks if admitting and self._reqs else 0
        if need_new + hits_from_free + reserve > self.pool.num_free:
            return False
        if rb is None:
            rb = self._reqs[request.request_id] = _ReqBlocks()
        if hits:
            self.pool.touch(hits)
            rb.blocks.extend(hits)
            rb.num_registered = len(rb.blocks)
        if need_new:
            rb.blocks.extend(self.pool.allocate(need_new))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's full, computed blocks in the prefix cache, then free
        those left of the sliding window.

        Only tokens counted in ``num_computed_tokens`` are hashed: draft tokens that
        were rejected never reach the cache.
        """
        rb = self._reqs.get(request.request_id)
        if rb is None:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(rb.blocks))
        if self.enable_prefix_caching and num_full > rb.num_registered:
            rb.hashes = self._full_block_hashes(request, num_full * self.block_size, rb.hashes[:num_full])
            for i in range(rb.num_registered, num_full):
                self.pool.register(rb.blocks[i], rb.hashes[i])
            rb.num_registered = num_full
        if self.sliding_window is not None:
            self._free_outside_window(request, rb)

    def _free_outside_window(self, request: Request, rb: _ReqBlocks) -> None:
        # The next query sits at num_computed_tokens; it and later ones see keys > position - window.
        first_seen = request.num_computed_tokens - self.sliding_window + 1
        n = min(max(0, first_seen) // self.block_size, len(rb.blocks))
        if n <= rb.num_freed:
            return
        out = rb.blocks[rb.num_freed:n]
        rb.blocks[rb.num_freed:n] = [_FREED] * len(out)
        rb.num_freed = n
        self.pool.release(list(reversed(out)))

    def trim(self, request: Request, keep_tokens: int) -> None:
        """Free the request's blocks beyond those holding its first ``keep_tokens`` tokens."""
        rb = self._reqs.get(request.request_id)
        if rb is None:
            return
        keep = self.blocks_needed(keep_tokens)
        if len(rb.blocks) > keep:
            extra = rb.blocks[keep:]
            del rb.blocks[keep:]
            self.pool.release(list(reversed(extra)))

    def free(self, request: Request) -> None:
        """Release all of a request's blocks (finish, abort or preemption)."""
        rb = self._reqs.pop(request.request_id, None)
        if rb is not None:
            self.pool.release(list(reversed(rb.blocks[rb.num_freed:])))

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
