"""Every supported family against transformers: greedy tokens and logprobs, with chunked
prefill, prefix caching, preemption and n-gram speculation on together, and prompts longer
than the sliding windows. The models are tiny random ones from ``tests.family_models``,
loaded from their safetensors folders by our loader."""

from __future__ import annotations

import random

import pytest

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.kv_cache import _FREED, KVCacheManager
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.config import ModelConfig
from llmserve.models.hf_loader import HFLoader
from llmserve.models.kv_layout import kv_layout
from tests.family_models import FAMILIES, VOCAB, hf_greedy, make_family

N = 16


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / request.param
    hf = make_family(request.param, folder)
    config, weights = HFLoader().load(folder)
    rng = random.Random(5)
    rep = [rng.randrange(VOCAB) for _ in range(9)]
    base = [rng.randrange(VOCAB) for _ in range(30)]
    prompts = [
        rep * 4,                                        # repeats: n-gram drafts get accepted
        base + [rng.randrange(VOCAB) for _ in range(7)],  # longer than every window
        base[:20] + [rng.randrange(VOCAB) for _ in range(5)],  # shares a prefix with the one above
        [rng.randrange(VOCAB) for _ in range(3)],
        list(base),
    ]
    return request.param, config, weights, prompts, [hf_greedy(hf, p, N) for p in prompts]


def test_config_names_the_family(family):
    name, config, *_ = family
    assert config.family == ("llama" if name == "llama3" else name)
    assert ModelConfig.from_hf_dict(config.to_hf_dict(), config.name) == config


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                         "prompt_lookup_max": 3, "adaptive": False}])
def test_greedy_tokens_and_logprobs_equal_transformers(family, spec):
    _, config, weights, prompts, ref = family
    # 4-token blocks, a 7-token step budget (chunked prefill), a pool that preempts: 20 blocks,
    # 12 where every layer slides (a request holds its window's blocks only). Where sliding and
    # full layers mix, a block is a page of one group's layers (kv_layout) and freed sliding
    # blocks are soon reused in a tight pool: the tightest pool that holds the longest request
    # (53 tokens) preempts, a roomier one hits the cache.
    windows = kv_layout(config).windows
    sc = EngineConfig(speculative_config=spec).speculative_config
    step = 7 + (sc.max_speculative_tokens if sc else 0)  # as the engine counts a step's tokens
    tight = next(n for n in range(8, 999)
                 if KVCacheManager(n, 4, windows=windows, step_tokens=step).token_capacity >= 53)
    pools = [12] if config.max_window else [20] if len(windows) == 1 else [tight, 30 * len(windows)]
    engines = [_oracle_run(config, weights, prompts, ref, spec, blocks) for blocks in pools]
    assert any(eng.scheduler.num_preemptions > 0 for eng in engines)
    assert any(eng.kv.prefix_hits > 0 for eng in engines)
    for eng in engines:
        assert eng.kv.num_free_blocks == eng.kv.num_blocks
        if spec:
            assert eng.spec.num_draft_tokens > 0


def _oracle_run(config, weights, prompts, ref, spec, blocks: int) -> EngineCore:
    sp = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, logprobs=0)
    eng = EngineCore(EngineConfig(block_size=4, max_num_batched_tokens=7, num_kv_blocks=blocks,
                                  enable_prefix_caching=True, speculative_config=spec, dtype="fp32"),
                     config, weights)
    arrivals = {0: [(str(i), p, sp) for i, p in enumerate(prompts[:2])],
                3: [(str(i), p, sp) for i, p in enumerate(prompts[2:], start=2)]}
    outs: dict[str, list] = {}
    step = 0
    while eng.has_unfinished() or any(s >= step for s in arrivals):
        for args in arrivals.get(step, []):
            eng.add_request(*args)
        for out in eng.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0]
        step += 1
        assert step < 5000
    for i, (tokens, logprobs) in enumerate(ref):
        got = outs[str(i)]
        assert got.token_ids == tokens, f"prompt {i}, {blocks} blocks"
        assert [lp.logprob for lp in got.logprobs] == pytest.approx(logprobs, abs=2e-4), f"prompt {i}"
    return eng


def _long_twice(family: str, folder, blocks: int, each_step=None) -> tuple[EngineCore, int]:
    """A 70-token prompt run twice (8-token chunks, 4-token blocks), each token-exact against
    transformers; returns the engine and the most blocks held at once. ``each_step(eng, rid)``
    checks the tables after every step."""
    hf = make_family(family, folder)
    config, weights = HFLoader().load(folder)
    prompt = [random.Random(9).randrange(VOCAB) for _ in range(70)]
    ref, _ = hf_greedy(hf, prompt, N)
    eng = EngineCore(EngineConfig(block_size=4, max_num_batched_tokens=8, num_kv_blocks=blocks,
                                  enable_prefix_caching=True, dtype="fp32"), config, weights)
    sp = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True)
    peak = 0
    for rid in ("a", "b"):
        eng.add_request(rid, prompt, sp)
        out = None
        while eng.has_unfinished():
            for o in eng.step():
                out = o if o.finished else out
            peak = max(peak, eng.kv.num_blocks - eng.kv.num_free_blocks)
            if each_step is not None and rid in eng.scheduler.requests:
                each_step(eng, eng.scheduler.requests[rid])
        assert out.outputs[0].token_ids == ref, rid
    return eng, peak


def test_blocks_left_of_every_window_are_freed(tmp_path):
    """Mistral slides on every layer: a long request holds its window's blocks, not its
    whole context, and the freed blocks stay in the prefix cache for the next request."""
    eng, peak = _long_twice("mistral", tmp_path / "m", 64)  # a 12-token window
    # 86 tokens fill 22 blocks; held at once: the window (12), a chunk (8) and two partial blocks
    assert peak <= (12 + 8) // 4 + 2
    assert eng.kv.prefix_hits > 0  # "b" reused the blocks "a" freed


def test_sliding_layers_free_their_blocks_while_full_layers_keep_theirs(tmp_path):
    """Gemma 3 mixes sliding and full layers (here sliding, full, sliding; a 12-token window):
    each layer group has its own block table (kv_layout), the sliding groups hold their
    window's blocks only, the full group every block, and the next request reuses them."""
    def tables_hold_what_they_should(eng, req):
        for table, w in zip(eng.kv._reqs[req.request_id].tables, eng.kv.windows):
            real = [b for b in table.blocks if b is not _FREED]
            if w is None:  # a full layer keeps every block of the context
                assert len(real) == len(table.blocks) >= req.num_computed_tokens // 4
            else:
                assert len(real) <= (12 + 8) // 4 + 2

    eng, peak = _long_twice("gemma3", tmp_path / "g", 96, tables_hold_what_they_should)
    assert sorted(eng.kv.windows, key=str) == [12, 12, None] and eng.model.kv_layout.group_size == 1
    # 86 tokens fill 22 blocks; one table for all three layers would hold 3 x 22 pages
    assert peak <= 22 + 2 * ((12 + 8) // 4 + 2) < 3 * 22
    assert eng.kv.prefix_hits > 0  # "b" reused what "a" left in the cache


def test_phi3_longrope_past_the_trained_context(tmp_path):
    """LongRoPE as transformers computes it: a prompt past ``original_max_position_embeddings``
    reads the long factors at every position (the no-cache oracle); a shorter one keeps its
    short-factor keys and switches at the boundary while decoding (transformers' cached
    generate). Chunked prefill and a prefix shared between the two regimes: the short
    prompt's cached blocks must not serve the long one (their keys were rotated otherwise)."""
    import torch

    hf = make_family("phi3", tmp_path / "phi3", original_max_position_embeddings=24, max_position_embeddings=96)
    config, weights = HFLoader().load(tmp_path / "phi3")
    rng = random.Random(3)
    short = [rng.randrange(VOCAB) for _ in range(20)]  # 20 + 16 crosses 24 while decoding
    long = short + [rng.randrange(VOCAB) for _ in range(10)]  # 30: past it from the start
    with torch.no_grad():
        crossing = hf.generate(torch.tensor([short]), max_new_tokens=N, do_sample=False, min_new_tokens=N)
    want = {"short": crossing[0, len(short):].tolist(), "long": hf_greedy(hf, long, N)[0]}
    eng = EngineCore(EngineConfig(block_size=4, max_num_batched_tokens=7, enable_prefix_caching=True,
                                  dtype="fp32"), config, weights)
    sp = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True)
    for rid, prompt in (("short", short), ("long", long)):  # one after the other: the cache is warm
        eng.add_request(rid, prompt, sp)
        got = None
        while eng.has_unfinished():
            got = next((o for o in eng.step() if o.finished), got)
        assert got.outputs[0].token_ids == want[rid], rid
    assert eng.kv.prefix_hits == 0  # (same tokens, other rotation: never shared)
