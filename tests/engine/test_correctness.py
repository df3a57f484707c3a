"""Greedy outputs equal Hugging Face transformers token for token, with every feature on together."""

from __future__ import annotations

import random

import pytest

from llmserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import make_tiny, run_to_completion

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def _prompts(seed: int, lengths, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def reference(tiny):
    prompts = _prompts(1, (1, 5, 16, 17, 33, 70), tiny.config.vocab_size)
    return prompts, [tiny.hf_greedy(p, GREEDY.max_tokens) for p in prompts]


@pytest.mark.parametrize("block_size,max_batched", [(16, 512), (4, 7), (8, 16), (1, 64), (32, 5)])
def test_batch_of_prompts_with_chunked_prefill(tiny, reference, block_size, max_batched):
    prompts, ref = reference
    eng = tiny.engine(block_size=block_size, max_num_batched_tokens=max_batched, num_kv_blocks=4096 // block_size)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    done = run_to_completion(eng)
    assert [done[str(i)] for i in range(len(prompts))] == ref


def test_requests_arriving_at_different_steps(tiny, reference):
    prompts, ref = reference
    eng = tiny.engine(block_size=8, max_num_batched_tokens=20, max_num_seqs=3, num_kv_blocks=256)
    arrivals = {3 * i: [(str(i), p, GREEDY)] for i, p in enumerate(prompts)}
    done = run_to_completion(eng, arrivals)
    assert [done[str(i)] for i in range(len(prompts))] == ref


def test_tied_embeddings_and_mha():
    m = make_tiny(seed=3, heads=4, kv_heads=4, tie=True)
    prompts = _prompts(2, (9, 21), m.config.vocab_size)
    eng = m.engine(block_size=4, max_num_batched_tokens=8, num_kv_blocks=128)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    done = run_to_completion(eng)
    assert [done[str(i)] for i in range(2)] == [m.hf_greedy(p, GREEDY.max_tokens) for p in prompts]


def test_a_head_size_the_decode_kernel_does_not_take():
    """Head size 12 (not a multiple of the kernel's 8 floats): decode takes the torch path
    instead of failing at the first step of a model that loaded."""
    m = make_tiny(seed=4, hidden=36, heads=3, kv_heads=1)
    prompts = _prompts(2, (9, 21), m.config.vocab_size)
    eng = m.engine(block_size=4, max_num_batched_tokens=8, num_kv_blocks=128)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    done = run_to_completion(eng)
    assert [done[str(i)] for i in range(2)] == [m.hf_greedy(p, GREEDY.max_tokens) for p in prompts]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_shared_prefixes_preemption_and_chunking_together(tiny, prefix_caching):
    """Prefixes shared inside a block, on a block boundary, and whole prompts; a pool so
    small that requests are preempted and recomputed; chunked prefill on."""
    v = tiny.config.vocab_size
    rng = random.Random(7)
    base = [rng.randrange(v) for _ in range(40)]
    prompts = [
        base[:19] + [rng.randrange(v) for _ in range(6)],  # shares 19 tokens: inside a block
        base[:16] + [rng.randrange(v) for _ in range(9)],  # shares exactly one 8-block boundary x2
        base[:32],                                          # a prefix of base, block aligned
        list(base),                                         # whole prompt repeated below
        list(base),
        base[:3],
    ]
    ref = [tiny.hf_greedy(p, 20) for p in prompts]
    sp = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    # 18 blocks of 8 = 144 slots: far fewer than 6 requests of up to 60 tokens need at once.
    eng = tiny.engine(block_size=8, max_num_batched_tokens=12, num_kv_blocks=18,
                      enable_prefix_caching=prefix_caching, max_num_seqs=6)
    arrivals = {0: [(str(i), p, sp) for i, p in enumerate(prompts[:3])],
                5: [(str(i), p, sp) for i, p in enumerate(prompts[3:], start=3)]}
    done = run_to_completion(eng, arrivals)
    assert [done[str(i)] for i in range(len(prompts))] == ref
    assert eng.scheduler.num_preemptions > 0
    assert eng.kv.num_free_blocks == eng.kv.num_blocks
    if prefix_caching:
        assert eng.kv.prefix_hits > 0
    else:
        assert eng.kv.prefix_hits == 0


def test_short_chunks_deep_in_a_prompt_are_grouped_and_still_exact(tiny, reference, monkeypatch):
    """A prompt chunk of up to ROW_ATTENTION_MAX tokens attends row by row while its context is
    short, grouped past ROW_CHUNK_CONTEXT (lowered here to 32): both ways, HF's tokens."""
    import llmserve.engine.runner as runner

    monkeypatch.setattr(runner, "ROW_CHUNK_CONTEXT", 32)
    kinds: list[tuple[int, int]] = []  # (query length of a group, longest context)
    real = runner.build_group
    monkeypatch.setattr(runner, "build_group", lambda start, q_len, ctx, *a: (
        kinds.append((q_len, max(ctx))), real(start, q_len, ctx, *a))[1])
    prompts, ref = reference
    eng = tiny.engine(block_size=8, max_num_batched_tokens=12, num_kv_blocks=512)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    done = run_to_completion(eng)
    assert [done[str(i)] for i in range(len(prompts))] == ref
    assert any(q > 1 and c > 32 and q <= 12 for q, c in kinds)  # a short chunk, grouped
    assert any(q == 1 and c <= 32 for q, c in kinds)
