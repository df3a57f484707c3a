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


# Stands in a block table for a block freed because it left its group's sliding window:
# positions stay aligned, and attention masks those keys (reading block 0 there is harmless).
_FREED = KVBlock(0)


@dataclass
class _Table:
    """One KV group's blocks of one request (``llmserve.models.kv_layout``)."""

    blocks: list[KVBlock] = field(default_factory=list)
    num_registered: int = 0  # leading blocks registered in the prefix cache (or freed)
    num_freed: int = 0  # leading blocks freed outside the sliding window (``_FREED`` in ``blocks``)


@dataclass
class _ReqBlocks:
    tables: list[_Table]
    hashes: list[bytes] = field(default_factory=list)  # hashes of the request's full blocks


class KVCacheManager:
    """Owns every block reference of every request.

    ``watermark_blocks`` stay free when admitting a new request, so requests that
    are already running can grow a little before anything must be preempted.

    ``windows``: one per KV group (``kv_layout``): the sliding window of the group's layers,
    or None where they see the whole context; ``sliding_window`` stands for one group with
    that window. Each request has a block table per group, all from one pool. A sliding
    group frees a request's blocks whose keys no future query can see as it advances (as
    vLLM's sliding-window and hybrid managers do); registered in the prefix cache first,
    they stay reusable until evicted, and a prefix hit needs of a sliding group only the
    blocks inside the window. ``step_tokens``: the most tokens one step adds to a request.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 watermark: float = 0.01, model_key: str = "", sliding_window: int | None = None,
                 step_tokens: int = 0, windows: tuple[int | None, ...] | None = None) -> None:
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = max(1, int(watermark * num_blocks)) if num_blocks > 8 else 0
        self._model_key = model_key.encode()
        self.windows = tuple(windows) if windows else (sliding_window,)
        self.token_capacity = self._token_capacity(step_tokens)
        self._reqs: dict[str, _ReqBlocks] = {}
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found

    def _token_capacity(self, step_tokens: int) -> int:
        """The longest request the pool holds alone. A sliding group holds at most its window,
        a step's tokens and a few partial blocks; a full group holds every block."""
        n, bs, groups = self.num_blocks, self.block_size, len(self.windows)
        sliding = [w for w in self.windows if w is not None]
        if not sliding:
            return n * bs
        held = self.blocks_needed(max(sliding) + step_tokens) + 4
        full = groups - len(sliding)
        if n // groups <= held:  # no longer than a window: every group holds all its blocks
            return n // groups * bs
        return sys.maxsize if full == 0 else (n - len(sliding) * held) // full * bs

    # ---- queries -------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_groups(self) -> int:
        return len(self.windows)

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
        """The request's block table of the first KV group."""
        rb = self._reqs.get(request_id)
        return [b.block_id for b in rb.tables[0].blocks] if rb else []

    def block_tables(self, request_id: str) -> list[list[int]]:
        """The request's block table of each KV group."""
        rb = self._reqs.get(request_id)
        return [[b.block_id for b in t.blocks] for t in rb.tables] if rb else [[] for _ in self.windows]

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix reuse ---------------------------------------------------------
    def _extra(self, request: Request) -> bytes:
        # surrogatepass: a lone surrogate (JSON allows "\ud800") must not make hashing raise;
        # it is still one-to-one, so distinct salts keep distinct caches.
        salt = request.cache_salt.encode("utf-8", "surrogatepass") if request.cache_salt else b""
        # the adapter's load id: one prompt under two adapters (or two loads of one name) never shares KV
        lora = b"\x00lora%d" % request.lora_id if request.lora_id else b""
        if request.rope_offset:  # (keys rotated with the long factors: no other request's)
            lora += b"\x00rope%d" % request.rope_offset
        return self._model_key + lora + b"\x00" + salt

    @staticmethod
    def _key(block_hash: bytes, group: int) -> bytes:
        """A block's cache key in one KV group: the same tokens hold other layers' KV there."""
        return block_hash + group.to_bytes(2, "little") if group else block_hash

    def _full_block_hashes(self, request: Request, upto_tokens: int, known: list[bytes]) -> list[bytes]:
        """Hashes of the full blocks among the first ``upto_tokens`` tokens, extending ``known``."""
        bs, extra = self.block_size, self._extra(request)
        hashes = list(known)
        toks = request.all_token_ids
        for i in range(len(hashes), upto_tokens // bs):
            hashes.append(hash_block(hashes[-1] if hashes else None, toks[i * bs:(i + 1) * bs], extra))
        return hashes

    def _first_seen(self, window: int | None, num_tokens: int) -> int:
        """The first block a query at ``num_tokens`` still sees (0 without a window)."""
        return 0 if window is None else max(0, num_tokens - window + 1) // self.block_size

    def get_computed_blocks(self, request: Request) -> tuple[list[list[KVBlock]], int]:
        """Longest cached prefix for a request not yet holding any blocks: its blocks per KV
        group (``_FREED`` where a sliding group needs none) and its length in tokens.

        At most ``num_tokens - 1`` tokens can hit, so the last token is always computed
        and yields logits.
        """
        if not self.enable_prefix_caching:
            return [], 0
        hashes = self._full_block_hashes(request, request.num_tokens - 1, [])
        look = self.pool.lookup
        n = len(hashes)
        for g, w in enumerate(self.windows):  # full groups: a chain from the first block
            if w is None:
                n = next((i for i in range(n) if look(self._key(hashes[i], g)) is None), n)
        while n > 0 and not all(look(self._key(hashes[i], g)) is not None  # sliding: the window's
                                for g, w in enumerate(self.windows) if w is not None
                                for i in range(self._first_seen(w, n * self.block_size), n)):
            n -= 1
        if n == 0:
            return [], 0
        hits = []
        for g, w in enumerate(self.windows):
            lo = self._first_seen(w, n * self.block_size)
            hits.append([_FREED] * lo + [look(self._key(hashes[i], g)) for i in range(lo, n)])
        return hits, n * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit: int) -> None:
        """Count one admitted request's lookup (vLLM's prefix_cache_queries / hits)."""
        if self.enable_prefix_caching:
            self.prefix_queries += num_tokens
            self.prefix_hits += num_hit

    # ---- allocation -------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int, *,
                       new_computed_blocks: list[list[KVBlock]] | None = None,
                       admitting: bool = False) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed ones.

        ``new_computed_blocks`` are prefix-cache hits (``get_computed_blocks``) for a request
        being admitted. Returns False (and changes nothing) when the pool cannot supply the blocks.
        """
        rb = self._reqs.get(request.request_id)
        hits = new_computed_blocks or [[] for _ in self.windows]
        want = self.blocks_needed(request.num_computed_tokens + num_new_tokens)
        need_new = [max(0, want - (len(rb.tables[g].blocks) if rb else 0) - len(hits[g]))
                    for g in range(len(self.windows))]
        # Cache hits sitting in the free queue stop being free once touched.
        hits_from_free = sum(1 for group in hits for b in group if b is not _FREED and b.ref_cnt == 0)
        # The watermark lets running requests grow; with none running it protects no one,
        # and would keep a request that needs the whole pool (allowed: it fits
        # max_model_len) waiting forever on an idle engine.
        reserve = self.watermark_blocks if admitting and self._reqs else 0
        if sum(need_new) + hits_from_free + reserve > self.pool.num_free:
            return False
        if rb is None:
            rb = self._reqs[request.request_id] = _ReqBlocks([_Table() for _ in self.windows])
        for t, group in zip(rb.tables, hits):  # every group's hits leave the free queue before
            if group:  # any allocation: one group's new block must not evict another's hit
                self.pool.touch([b for b in group if b is not _FREED])
                t.blocks.extend(group)
                t.num_registered = len(t.blocks)
                t.num_freed = sum(1 for b in group if b is _FREED)
        for t, n in zip(rb.tables, need_new):
            if n:
                t.blocks.extend(self.pool.allocate(n))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's full, computed blocks in the prefix cache, then free
        those left of each sliding window.

        Only tokens counted in ``num_computed_tokens`` are hashed: draft tokens that
        were rejected never reach the cache.
        """
        rb = self._reqs.get(request.request_id)
        if rb is None:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(rb.tables[0].blocks))
        if self.enable_prefix_caching and num_full > min(t.num_registered for t in rb.tables):
            rb.hashes = self._full_block_hashes(request, num_full * self.block_size, rb.hashes[:num_full])
            for g, t in enumerate(rb.tables):
                for i in range(t.num_registered, num_full):
                    if t.blocks[i] is not _FREED:
                        self.pool.register(t.blocks[i], self._key(rb.hashes[i], g))
                t.num_registered = max(t.num_registered, num_full)
        for t, w in zip(rb.tables, self.windows):
            if w is not None:
                self._free_outside_window(request, t, w)

    def _free_outside_window(self, request: Request, t: _Table, window: int) -> None:
        # The next query sits at num_computed_tokens; it and later ones see keys > position - window.
        n = min(self._first_seen(window, request.num_computed_tokens), len(t.blocks))
        if n <= t.num_freed:
            return
        out = t.blocks[t.num_freed:n]
        t.blocks[t.num_freed:n] = [_FREED] * len(out)
        t.num_freed = n
        self.pool.release(list(reversed(out)))

    def trim(self, request: Request, keep_tokens: int) -> None:
        """Free the request's blocks beyond those holding its first ``keep_tokens`` tokens."""
        rb = self._reqs.get(request.request_id)
        if rb is None:
            return
        keep = self.blocks_needed(keep_tokens)
        for t in rb.tables:
            if len(t.blocks) > keep:
                extra = t.blocks[keep:]
                del t.blocks[keep:]
                self.pool.release(list(reversed(extra)))

    def free(self, request: Request) -> None:
        """Release all of a request's blocks (finish, abort or preemption)."""
        rb = self._reqs.pop(request.request_id, None)
        if rb is not None:
            for t in rb.tables:
                self.pool.release(list(reversed(t.blocks[t.num_freed:])))

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
