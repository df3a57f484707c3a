"""Every supported family from GGUF (F32 and Q8_0, written as llama.cpp's converter writes
them) against transformers on the same tiny model: logits over a prompt longer than the
sliding windows."""

from __future__ import annotations

import pytest
import torch

from llmserve.models.attention import AttentionMetadata, build_group
from llmserve.models.gguf_loader import GGUFLoader
from llmserve.models.hf_loader import HFLoader
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.model_source import load_weights
from llmserve.models.weights import linear_factory_for
from tests.family_gguf import write_gguf
from tests.family_models import FAMILIES, GGUF_VARIANTS, VOCAB, make_family


def _logits(config, weights, ids: torch.Tensor, dtype: str = "fp32") -> torch.Tensor:
    m = LlamaForCausalLM(config, weights, linear_factory_for(dtype))
    t = len(ids)
    kv = m.allocate_kv_cache(t, 1)
    meta = AttentionMetadata(torch.arange(t), [build_group(0, t, [t], [list(range(t))], 1,
                                                          m.num_heads // m.num_kv_heads)])
    return m.compute_logits(m.forward(ids, torch.arange(t), meta, kv))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_equals_transformers(family, tmp_path):
    folder = tmp_path / family
    hf = make_family(family, folder, **GGUF_VARIANTS.get(family, {}))
    hf_config, _ = HFLoader().load(folder)
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    f32 = write_gguf(folder, tmp_path / "f32.gguf")
    config, weights = GGUFLoader().load(f32)
    # the store's fp32 conversion cache gives the same model back
    load_weights(f32, tmp_path / "store")
    cached, cached_weights = load_weights(f32, tmp_path / "store")
    assert (cached.family, cached.rope_scaling, cached.layer_types) == (config.family, config.rope_scaling,
                                                                          config.layer_types)
    torch.testing.assert_close(_logits(cached, cached_weights, ids), ref, atol=1e-4, rtol=1e-4)
    assert config.family == ("llama" if family == "mistral" else hf_config.family)  # converted as llama
    assert (config.layer_types, config.sliding_window) == (hf_config.layer_types, hf_config.sliding_window)
    torch.testing.assert_close(_logits(config, weights, ids), ref, atol=1e-4, rtol=1e-4)
    config, weights = GGUFLoader().load(write_gguf(folder, tmp_path / "q8.gguf", "Q8_0"))
    assert config.quantized_source
    got = _logits(config, weights, ids)
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_int8_weights_stay_close_to_fp32(family, tmp_path):
    """The int8 kernels serve every family: logits within 2% of the fp32 ones' range."""
    make_family(family, tmp_path / family)
    config, weights = HFLoader().load(tmp_path / family)
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2))
    ref, got = _logits(config, weights, ids), _logits(config, weights, ids, "int8")
    assert (got - ref).abs().max() < 0.02 * ref.abs().max()
    assert not torch.equal(got, ref)  # the int8 path did run
