"""The instance model: segments of steps must equal running the engine one step at a time."""

import heapq
import random

import pytest

from llmserve.lifecycle import InstanceState
from llmserve.sim.instance import Seq, SimInstance
from llmserve.sim.profile import InstanceProfile, StepModel

STEP = StepModel(base_s=0.01, per_prefill_token_s=2e-4, per_decode_seq_s=1e-3, per_context_token_s=3e-6)


def profile(**kw):
    base = dict(name="t", step=STEP, max_num_seqs=4, max_num_batched_tokens=64, kv_capacity_tokens=10_000,
                cold_start_s=1.0, warmup_s=0.0)
    base.update(kw)
    return InstanceProfile(**base)


def run_segments(prof, requests):
    """Drive a SimInstance with (arrival, prompt, output) requests; return {rid: (ttft_t, done_t)}."""
    inst = SimInstance(0, prof, 0.0, InstanceState.READY)
    heap, out, first = [], {}, {}
    arrivals = sorted((t, rid, p, o) for rid, (t, p, o) in enumerate(requests))
    k = 0
    while k < len(arrivals) or heap:
        if k < len(arrivals) and (not heap or arrivals[k][0] < heap[0][0]):
            t, rid, p, o = arrivals[k]
            k += 1
            if inst.add(Seq(rid, p, o), t):
                heapq.heappush(heap, (inst.seg_end, inst.version))
            continue
        t, version = heapq.heappop(heap)
        if version != inst.version:
            continue
        inst.end_segment(t)
        for s in inst.first_tokens:
            first[s.rid] = t
        for s in inst.finished:
            out[s.rid] = (first[s.rid], t)
        inst.first_tokens.clear()
        inst.finished.clear()
        if inst.plan(t):
            heapq.heappush(heap, (inst.seg_end, inst.version))
    return out, inst


def run_reference(prof, requests):
    """The same engine, one step at a time: the obviously-correct, slow version."""
    s = prof.step
    pending = sorted((t, rid, p, o) for rid, (t, p, o) in enumerate(requests))
    waiting, running, out, first = [], [], {}, {}
    kv, t, k = 0, 0.0, 0
    while k < len(pending) or waiting or running:
        while k < len(pending) and pending[k][0] <= t:
            waiting.append(list(pending[k][1:]) + [0, 0])  # rid, prompt, output, prefilled, generated
            k += 1
        if not waiting and not running:
            t = pending[k][0]
            continue
        budget, pre, dec, ctx, chunks = prof.max_num_batched_tokens, 0, 0, 0, {}
        for r in running:
            if r[3] == r[1]:
                dec += 1
                ctx += r[1] + r[4]
        budget -= dec
        for r in running:
            if r[3] < r[1] and budget > 0:
                c = min(r[1] - r[3], budget)
                chunks[r[0]] = c
                budget -= c
                pre += c
                ctx += r[3] + c
        while (budget > 0 and waiting and len(running) < prof.max_num_seqs
               and kv + waiting[0][1] + waiting[0][2] <= prof.kv_capacity_tokens):
            r = waiting.pop(0)
            running.append(r)
            kv += r[1] + r[2]
            c = min(r[1], budget)
            chunks[r[0]] = c
            budget -= c
            pre += c
            ctx += c
        t += s.step_time(pre, dec, ctx)
        for r in running:
            if r[0] in chunks:
                r[3] += chunks[r[0]]
                if r[3] == r[1]:
                    r[4] = 1
                    first[r[0]] = t
            else:
                r[4] += 1
        for r in [r for r in running if r[4] >= r[2]]:
            running.remove(r)
            kv -= r[1] + r[2]
            out[r[0]] = (first[r[0]], t)
    return out


def test_single_request_timing_by_hand():
    out, _ = run_segments(profile(), [(0.0, 10, 3)])
    ttft = 0.01 + 2e-4 * 10 + 3e-6 * 10
    decode = sum(0.01 + 1e-3 + 3e-6 * (10 + g) for g in (1, 2))
    assert out[0][0] == pytest.approx(ttft)
    assert out[0][1] == pytest.approx(ttft + decode)


@pytest.mark.parametrize("seed", range(6))
def test_segments_match_step_by_step(seed):
    rng = random.Random(seed)
    prof = profile(max_num_seqs=rng.choice([1, 3, 8]), max_num_batched_tokens=rng.choice([16, 64]),
                   kv_capacity_tokens=rng.choice([300, 100_000]))
    t, reqs = 0.0, []
    for _ in range(120):
        t += rng.expovariate(8.0)
        reqs.append((t, rng.randint(1, 90), rng.randint(1, 60)))
    fast, inst = run_segments(prof, reqs)
    slow = run_reference(prof, reqs)
    assert fast.keys() == slow.keys() == set(range(len(reqs)))
    for rid in slow:
        assert fast[rid][0] == pytest.approx(slow[rid][0], abs=1e-9), rid
        assert fast[rid][1] == pytest.approx(slow[rid][1], abs=1e-9), rid
    assert inst.in_flight == 0 and inst.kv_reserved == 0


def test_steps_done_inverts_decode_time():
    inst = SimInstance(0, profile(), 0.0, InstanceState.READY)
    inst.seg_n, inst.seg_ctx0, inst.seg_steps = 3, 500, 50
    for k in (0, 1, 7, 49, 50):
        t = inst._decode_time(k)
        assert inst._steps_done(t) == k
        if k:
            assert inst._steps_done(t - 1e-9) == k - 1


def test_tokens_and_busy_time_are_accounted():
    out, inst = run_segments(profile(), [(0.0, 10, 5), (0.0, 20, 5)])
    assert inst.tokens_total == 10 + 20 + 5 + 5
    assert inst.gen_total == 10
    assert inst.busy_total == pytest.approx(max(done for _, done in out.values()))
