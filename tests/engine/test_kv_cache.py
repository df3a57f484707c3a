"""KV block accounting: prefix reuse, eviction order, and invariants under random operations."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmserve.engine.kv_cache import _FREED, KVCacheManager
from llmserve.engine.request import Request, RequestStatus
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.scheduler import Scheduler, SchedulerConfig


def _req(rid, tokens, salt=None, max_tokens=4):
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens), max_tokens, cache_salt=salt)


def _admit(kv: KVCacheManager, r: Request) -> int:
    hits, n = kv.get_computed_blocks(r)
    r.num_computed_tokens = n
    assert kv.allocate_slots(r, r.num_tokens - n, new_computed_blocks=hits)
    r.num_computed_tokens = r.num_tokens
    kv.cache_computed_blocks(r)
    return n


def test_hits_follow_the_chain_and_the_salt():
    kv = KVCacheManager(32, 4)
    assert _admit(kv, _req("a", range(10))) == 0
    assert _admit(kv, _req("b", list(range(8)) + [99, 98])) == 8
    assert _admit(kv, _req("c", [0, 1, 2, 3, 9, 9, 9, 9, 9])) == 4  # chain breaks at block 2
    assert _admit(kv, _req("d", range(10), salt="tenant-2")) == 0  # another tenant: no sharing
    assert _admit(kv, _req("e", range(8))) == 4  # at most num_tokens - 1 tokens can hit


def test_eviction_is_lru_and_tail_before_head():
    kv = KVCacheManager(6, 2, watermark=0.0)
    a = _req("a", range(6))  # three full blocks
    _admit(kv, a)
    kv.free(a)
    order = [b.block_id for b in kv.pool.free_queue]
    a_blocks = order[-3:]
    # a's blocks were appended tail first: its last block is nearest the head
    x = _req("x", [50, 51, 52, 53, 54, 55, 56])  # needs 4 blocks: evicts one of a's blocks
    _admit(kv, x)
    still = _req("a2", range(6))
    hits, n = kv.get_computed_blocks(still)
    assert n == 4  # a's head blocks survived, its tail was evicted first
    assert [b.block_id for b in hits[0]] == [a_blocks[2], a_blocks[1]]


def test_free_queue_remove_from_middle_is_consistent():
    kv = KVCacheManager(8, 2, watermark=0.0)
    reqs = [_req(str(i), [i * 10, i * 10 + 1, i * 10 + 2]) for i in range(3)]
    for r in reqs:
        _admit(kv, r)
    for r in reqs:
        kv.free(r)
    assert kv.num_free_blocks == 8
    again = _req("again", [10, 11, 12])  # hits request 1's block in the middle of the queue
    assert _admit(kv, again) == 2
    assert kv.num_free_blocks == 8 - 2
    assert len(list(kv.pool.free_queue)) == kv.num_free_blocks


ops = st.lists(st.tuples(st.sampled_from(["add", "step", "step", "step", "abort", "stop"]),
                         st.integers(0, 7), st.integers(1, 30), st.integers(1, 12), st.integers(0, 1)),
               min_size=1, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(4, 40), st.sampled_from([1, 2, 4]), st.booleans(), st.integers(0, 3),
       st.sampled_from([None, (6, None), (5, 5, None), (7,)]))
def test_random_operations_keep_kv_accounting_exact(ops, num_blocks, block_size, caching, spec_k, windows):
    """``windows``: KV groups (kv_layout): all full, Gemma-like mixes, all sliding."""
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=caching, windows=windows,
                        step_tokens=16 + spec_k)
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16,
                                  max_model_len=num_blocks * block_size), kv)
    n = 0
    for op, a, b, c, prio in ops:
        if op == "add":
            r = Request(f"r{n}", [(a * 7 + i) % 5 for i in range(b)], SamplingParams(max_tokens=c), c,
                        arrival_time=n, priority=prio)
            n += 1
            try:
                s.add_request(r)
            except ValueError:
                assert b + c > min(num_blocks * block_size, kv.token_capacity)
        elif op in ("abort", "stop") and s.requests:
            rid = sorted(s.requests)[a % len(s.requests)]
            s.finish_request(rid, RequestStatus.FINISHED_ABORTED if op == "abort" else RequestStatus.FINISHED_STOPPED)
        elif op == "step":
            for r in s.running:  # speculative drafts, some accepted, some rejected below
                r.spec_token_ids = [a % 5] * spec_k
            out = s.schedule()
            sampled = {}
            for x in out.scheduled:
                if x.sample:
                    accepted = x.spec_token_ids[:a % (len(x.spec_token_ids) + 1)]
                    sampled[x.request.request_id] = accepted + [b % 5]
            # two running requests never hold the same block unless it is a shared, full, cached one
            owners: dict[int, list[str]] = {}
            for r in s.running:
                for blk in held(kv, r):
                    owners.setdefault(blk.block_id, []).append(r.request_id)
            for bid, who in owners.items():
                blk = kv.pool.blocks[bid]
                assert blk.ref_cnt == len(who)
                if len(who) > 1:
                    assert blk.block_hash is not None
            s.update_from_output(out, sampled)
            for r in s.running:
                assert r.num_computed_tokens <= r.num_tokens - 1 or r.num_computed_tokens < r.num_prompt_tokens
                for g, (table, w) in enumerate(zip(kv.block_tables(r.request_id), kv.windows)):
                    assert len(table) * block_size >= r.num_computed_tokens
                    real = [b for b in kv._reqs[r.request_id].tables[g].blocks if b is not _FREED]
                    if w is not None:  # a sliding group holds its window, a step and partial blocks only
                        assert len(real) <= kv.blocks_needed(w + 16 + spec_k) + 2
        assert all(b.ref_cnt >= 0 for b in kv.pool.blocks)
        assert kv.num_free_blocks == sum(1 for b in kv.pool.blocks if b.ref_cnt == 0)
    for rid in list(s.requests):
        s.finish_request(rid, RequestStatus.FINISHED_ABORTED)
    assert kv.num_free_blocks == kv.num_blocks
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)


def held(kv: KVCacheManager, r: Request) -> list:
    """The blocks a request references, over every KV group (freed ones left out)."""
    rb = kv._reqs.get(r.request_id)
    return [b for t in rb.tables for b in t.blocks if b is not _FREED] if rb else []


def test_a_request_needing_the_whole_pool_starts_on_an_idle_engine():
    # 32 blocks of 16 tokens: a 500-token prompt needs all 32, and the admission
    # watermark (1 block) used to keep it waiting forever although it fits the pool.
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512), KVCacheManager(32, 16))
    big = _req("big", range(500), max_tokens=1)
    sched.add_request(big)
    out = sched.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["big"]
    # With another request holding blocks the watermark still applies to admissions.
    kv = KVCacheManager(32, 16)
    small = _req("small", range(16))
    _admit(kv, small)
    other = _req("other", range(1000, 1000 + 31 * 16))
    assert not kv.allocate_slots(other, other.num_tokens, admitting=True)
    assert kv.allocate_slots(other, other.num_tokens, admitting=False)
