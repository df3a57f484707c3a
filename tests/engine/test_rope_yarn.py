"""YaRN rope scaling against transformers: the frequencies and attention factor of
``_compute_yarn_parameters`` for every option it reads, and tiny Qwen3 and Llama models (HF
folders, and a GGUF with llama.cpp's yarn keys) whose greedy tokens and logprobs equal
transformers' on prompts longer than the original context."""

from __future__ import annotations

import random

import pytest
import torch

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.config import ModelConfig
from llmserve.models.gguf_loader import GGUFLoader
from llmserve.models.hf_loader import HFLoader
from llmserve.models.rope import RotaryEmbedding, inv_frequencies
from llmserve.models.rope_yarn import attention_factor
from tests.family_gguf import write_gguf
from tests.family_models import VOCAB, hf_greedy, make_family

N = 12
ORIGINAL = 64
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}


@pytest.mark.parametrize("extra", [
    {},
    {"beta_fast": 8, "beta_slow": 2},
    {"truncate": False},
    {"mscale": 0.707, "mscale_all_dim": 1.0},
    {"attention_factor": 1.5},
    {"factor": None},  # the ratio of the model's length to the original
])
@pytest.mark.parametrize("config_cls,fields", [
    ("LlamaConfig", {}),
    ("Qwen3Config", {"head_dim": 32, "rope_theta": 1e6}),
])
def test_frequencies_and_attention_factor_equal_transformers(config_cls, fields, extra):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = getattr(transformers, config_cls)(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                           max_position_embeddings=512, rope_scaling={**YARN, **extra}, **fields)
    want_inv, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    config = ModelConfig.from_hf_dict({**hf.to_dict(), "vocab_size": VOCAB, "intermediate_size": 128,
                                       "num_hidden_layers": 2})
    assert torch.equal(inv_frequencies(config.rotary_dim, config.rope_theta, config.rope_scaling), want_inv)
    assert attention_factor(config.rope_scaling) == pytest.approx(want_factor, rel=1e-12)
    assert want_factor != 1.0  # the cos/sin scale is exercised
    rope = RotaryEmbedding(config.head_dim, 8, config.rope_theta, config.rope_scaling, config.rotary_dim)
    assert rope.cos[0, 0].item() == pytest.approx(want_factor, rel=1e-6)


def test_the_legacy_type_key_and_a_top_level_original_length_are_read():
    """``type`` instead of ``rope_type``, and (Phi-3's way) the original length beside the scaling."""
    from llmserve.models.families import arch_from_hf

    d = {"model_type": "llama", "max_position_embeddings": 100, "original_max_position_embeddings": 50,
         "rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 10}}
    s = arch_from_hf(d)["rope_scaling"]
    assert (s["rope_type"], s["original_max_position_embeddings"], "type" in s) == ("yarn", 50, False)


def test_phi3_reads_yarn_as_longrope_as_transformers_does():
    import transformers

    scaling = {"type": "yarn", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    hf = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=512,
                                 original_max_position_embeddings=64, rope_scaling=dict(scaling))
    assert hf.rope_parameters["rope_type"] == "longrope"
    config = ModelConfig.from_hf_dict({"model_type": "phi3", "vocab_size": VOCAB, "hidden_size": 64,
                                       "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                       "max_position_embeddings": 512, "original_max_position_embeddings": 64,
                                       "rope_scaling": scaling})
    assert config.rope_scaling["rope_type"] == "longrope" and config.max_position_embeddings == 512


def _greedy(config, weights, prompts) -> list:
    """Engine greedy outputs, fp32, with 8-token chunks so a long prompt's prefill spans steps."""
    eng = EngineCore(EngineConfig(block_size=4, max_num_batched_tokens=8, num_kv_blocks=200,
                                  enable_prefix_caching=True, dtype="fp32"), config, weights)
    sp = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, logprobs=0)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, sp)
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o.outputs[0]
    return [outs[str(i)] for i in range(len(prompts))]


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    base = [rng.randrange(VOCAB) for _ in range(100)]
    return [base, base[:70] + [rng.randrange(VOCAB) for _ in range(5)], base[:20]]


# max_position_embeddings below original * factor, as a Qwen config with the card's scaling
# added: the served context is stretched (256), and the 100-token prompt runs past 80.
@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_greedy_tokens_and_logprobs_equal_transformers(family, tmp_path):
    hf = make_family(family, tmp_path / family, max_position_embeddings=80, rope_scaling=dict(YARN))
    config, weights = HFLoader().load(tmp_path / family)
    assert config.rope_scaling["rope_type"] == "yarn" and config.max_position_embeddings == 4 * ORIGINAL
    assert ModelConfig.from_hf_dict(config.to_hf_dict(), config.name) == config  # as the GGUF cache rereads it
    prompts = _prompts()
    for prompt, got in zip(prompts, _greedy(config, weights, prompts)):
        tokens, logprobs = hf_greedy(hf, prompt, N)
        assert got.token_ids == tokens
        assert [lp.logprob for lp in got.logprobs] == pytest.approx(logprobs, abs=2e-4)


def test_gguf_with_llama_cpps_yarn_keys_equals_transformers(tmp_path, monkeypatch):
    """The keys ``convert_hf_to_gguf.py`` writes for a yarn config (type, factor, original
    context, the explicit attention factor as yarn_attn_factor, betas)."""
    import gguf

    scaling = {**YARN, "attention_factor": 1.2, "beta_fast": 16.0, "beta_slow": 2.0}
    hf = make_family("qwen3", tmp_path / "q", rope_scaling=scaling)
    plain = gguf.GGUFWriter.add_rope_freq_base

    def with_yarn(w, value):  # the test writer knows no yarn: add what the converter adds
        plain(w, value)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(ORIGINAL)
        w.add_rope_scaling_yarn_attn_factor(scaling["attention_factor"])
        w.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])

    monkeypatch.setattr(gguf.GGUFWriter, "add_rope_freq_base", with_yarn)
    config, weights = GGUFLoader().load(write_gguf(tmp_path / "q", tmp_path / "q.gguf"))
    assert config.rope_scaling["attention_factor"] == pytest.approx(1.2)
    assert ModelConfig.from_hf_dict(config.to_hf_dict(), config.name) == config
    prompt = _prompts()[0]
    got = _greedy(config, weights, [prompt])[0]
    tokens, logprobs = hf_greedy(hf, prompt, N)
    assert got.token_ids == tokens
    assert [lp.logprob for lp in got.logprobs] == pytest.approx(logprobs, abs=2e-4)
