"""LoRA adapters in the engine against transformers + peft's merged weights: each row of a
batch mixing three adapters and the base gets the merged model's greedy tokens and logprobs,
with chunked prefill, prefix caching and preemption on (and n-gram speculation)."""

from __future__ import annotations

import random

import pytest

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.hf_loader import HFLoader
from llmserve.models.kv_layout import kv_layout
from tests.family_models import FAMILIES, VOCAB, hf_greedy, make_family
from tests.lora_adapters import make_adapter

N = 10
# (rank, targets) of the three adapters; Phi-3's q/k/v and gate/up are fused modules
TARGETS = {
    "default": [(4, ["q_proj", "v_proj"]), (8, ["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
                (16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])],
    "phi3": [(4, ["qkv_proj"]), (8, ["o_proj", "gate_up_proj"]), (16, ["qkv_proj", "o_proj", "gate_up_proj",
                                                                      "down_proj"])],
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    hf = make_family(name, root / "base")
    config, weights = HFLoader().load(root / "base")
    adapters = {}
    for i, (r, targets) in enumerate(TARGETS.get(name, TARGETS["default"])):
        merged = make_adapter(hf, root / f"a{i}", r, targets, seed=10 + i, rslora=i == 2,
                              scale=1.0 if name.startswith("gemma") else 0.3)  # (Gemma's norms damp deltas)
        adapters[f"a{i}"] = (str(root / f"a{i}"), merged)
    rng = random.Random(3)
    shared = [rng.randrange(VOCAB) for _ in range(22)]
    # (prompt, adapter or None): one prompt under every adapter and the base, others apart
    jobs = [(shared, a) for a in (None, "a0", "a1", "a2")]
    jobs += [(shared[:12] + [rng.randrange(VOCAB) for _ in range(9)], "a1"), (shared, "a1"),
             ([rng.randrange(VOCAB) for _ in range(5)], "a2"), ([rng.randrange(VOCAB) for _ in range(14)], None)]
    models = {None: hf, **{k: m for k, (_, m) in adapters.items()}}
    ref = [hf_greedy(models[a], p, N) for p, a in jobs]
    # the adapters matter: the shared prompt's tokens or logprobs differ under each
    for i in range(4):
        for j in range(i):
            assert ref[i][0] != ref[j][0] or max(abs(x - y) for x, y in zip(ref[i][1], ref[j][1])) > 1e-3  # (5x the tolerance below)
    return name, config, weights, {k: p for k, (p, _) in adapters.items()}, jobs, ref


def _run(eng: EngineCore, jobs) -> dict:
    sp = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, logprobs=0)
    arrivals = {0: list(enumerate(jobs))[:4], 1: list(enumerate(jobs))[4:]}
    outs, step = {}, 0
    while eng.has_unfinished() or any(s >= step for s in arrivals):
        for i, (p, a) in arrivals.get(step, []):
            eng.add_request(str(i), p, sp, lora_name=a)
        for out in eng.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0]
        step += 1
        assert step < 5000
    return outs


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                         "prompt_lookup_max": 3, "adaptive": False}])
def test_mixed_batch_equals_merged_models(family, spec):
    _, config, weights, paths, jobs, ref = family
    windows = kv_layout(config).windows
    # Mixed sliding/full layers keep a block table per KV group, drawn from one pool: the
    # tightest pool that holds the longest job (32 tokens) preempts, a roomier one hits the cache.
    if config.max_window:
        pools = [12]
    elif len(windows) == 1:
        pools = [16]
    else:
        sc = EngineConfig(speculative_config=spec).speculative_config
        step = 9 + (sc.max_speculative_tokens if sc else 0)
        pools = [next(n for n in range(8, 999)
                      if KVCacheManager(n, 4, windows=windows, step_tokens=step).token_capacity >= 32),
                 16 * len(windows)]
    engines = []
    for blocks in pools:
        eng = EngineCore(EngineConfig(block_size=4, max_num_batched_tokens=9, num_kv_blocks=blocks,
                                      enable_prefix_caching=True, speculative_config=spec, dtype="fp32",
                                      lora_modules=paths, max_loras=3, max_lora_rank=16), config, weights)
        outs = _run(eng, jobs)
        for i, (tokens, logprobs) in enumerate(ref):
            got = outs[str(i)]
            assert got.token_ids == tokens, f"job {i} ({jobs[i][1]}), {blocks} blocks"
            assert [lp.logprob for lp in got.logprobs] == pytest.approx(logprobs, abs=2e-4), f"job {i}"
        assert eng.kv.num_free_blocks == eng.kv.num_blocks
        engines.append(eng)
    assert any(eng.scheduler.num_preemptions > 0 for eng in engines)
    assert any(eng.kv.prefix_hits > 0 for eng in engines)


def test_int8_weights_with_adapters_equal_merged_models(tmp_path):
    """On the int8 path (weights on GGUF's Q4_1 grid, held exactly; exact activations) each row's
    adapter delta, added in fp32 on the int8 product, gives the merged fp32 model's tokens."""
    from tests.engine.test_weight_formats import q4_1_tiny

    t = q4_1_tiny(seed=3)
    paths, merged = {}, {None: t.hf}
    for i, (r, targets) in enumerate(TARGETS["default"]):
        merged[f"a{i}"] = make_adapter(t.hf, tmp_path / f"a{i}", r, targets, seed=20 + i)
        paths[f"a{i}"] = str(tmp_path / f"a{i}")
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 40, 9)]
    jobs = list(zip(prompts, [None, "a0", "a1", "a2"])) + [(prompts[2], "a2"), (prompts[1], None)]
    eng = t.engine(dtype="int8", exact_activations=True, num_kv_blocks=64, block_size=4, max_num_batched_tokens=16,
                   lora_modules=paths, max_loras=3)
    sp = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True)
    for i, (p, a) in enumerate(jobs):
        eng.add_request(str(i), p, sp, lora_name=a)
    done = {}
    while eng.has_unfinished():
        done.update({o.request_id: o.outputs[0].token_ids for o in eng.step() if o.finished})
    for i, (p, a) in enumerate(jobs):
        assert done[str(i)] == hf_greedy(merged[a], p, N)[0], f"job {i} ({a})"
