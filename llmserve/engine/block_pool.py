"""Physical KV blocks: reference counts, the free queue and the prefix-hash map.

Only :class:`llmserve.engine.kv_cache.KVCacheManager` calls into this module; it
is the single owner of reference counts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False, slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    # Hash of the full block's content (chained with its parent), set once the block
    # is full and computed; None while it is partial or after it is evicted.
    block_hash: bytes | None = None
    prev: "KVBlock | None" = None
    next: "KVBlock | None" = None


class FreeBlockQueue:
    """Blocks no request references, in eviction order (head is evicted first).

    Why a doubly linked list: a cached block that a new request hits must leave the
    queue from wherever it sits, in O(1); a Python list would make that O(n) and
    ``collections.OrderedDict`` would hide the order we rely on.

    Eviction order: freed blocks are appended at the tail, so the head holds the
    least recently used ones. When a request frees its chain of blocks it appends
    them tail-first (last block of the sequence first), so within one chain the tail
    is evicted before the head. That keeps the most shareable part of a prefix (its
    beginning, which later blocks depend on) cached the longest: a chain without its
    head is useless, a chain without its tail still serves a shorter prefix.
    """

    def __init__(self, blocks: list[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def popleft(self) -> KVBlock:
        block = self._head.next
        if block is self._tail or block is None:
            raise RuntimeError("no free KV block")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        assert block.prev is not None and block.next is not None, "block not in free queue"
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_free -= 1

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev
        assert last is not None
        last.next, block.prev, block.next, self._tail.prev = block, last, self._tail, block
        self.num_free += 1

    def __iter__(self):
        b = self._head.next
        while b is not self._tail and b is not None:
            yield b
            b = b.next


class BlockPool:
    """All KV blocks of one instance and the map from content hash to cached block."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVBlock] = {}

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def allocate(self, n: int) -> list[KVBlock]:
        """Take ``n`` blocks from the head of the free queue, evicting their cache entry."""
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} KV blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on blocks found in the prefix cache."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def release(self, blocks_tail_first: list[KVBlock]) -> None:
        """Drop one reference each; blocks reaching zero join the free queue's tail."""
        for block in blocks_tail_first:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"negative ref count on block {block.block_id}"
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    block.block_hash = None
                self.free_queue.append(block)

    def register(self, block: KVBlock, block_hash: bytes) -> None:
        """Record a full, computed block under its content hash (first writer wins)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return  # an identical block is already cached; this copy stays private
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is in use."""
        if self.num_free != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True
