"""GGUF loader: names, shapes and the Q/K permutation against independent references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmserve.models.gguf_loader import GGUFLoader, reverse_permute
from llmserve.models.hf_loader import HFLoader
from llmserve.models.loader import ModelLoadError
from tests.helpers import _llama_cpp_permute, make_tiny_gguf, make_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny HF folder (6 heads over 1 KV head: Q and K permute differently) and its GGUF forms."""
    root = tmp_path_factory.mktemp("gguf")
    hf = make_tiny_llama(root, hidden_size=96, num_attention_heads=6, num_key_value_heads=1, seed=3)
    files = {q: make_tiny_gguf(hf, root / f"tiny-{q}.gguf", q) for q in ("F32", "F16", "Q8_0")}
    return hf, files


@pytest.mark.parametrize("n_head,rows,cols", [(4, 64, 8), (1, 16, 3), (3, 48, 0)])
def test_reverse_permute_undoes_llama_cpp(n_head, rows, cols):
    w = np.random.default_rng(0).standard_normal((rows, cols) if cols else (rows,)).astype(np.float32)
    permuted = _llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(reverse_permute(permuted, n_head), w)


def test_f32_gguf_equals_the_hf_checkpoint_exactly(tiny):
    hf, files = tiny
    ref_cfg, ref = HFLoader().load(hf)
    cfg, weights = GGUFLoader().load(files["F32"])
    assert set(weights) == set(ref)
    for name in ref:
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], ref[name]), name
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == \
        (ref_cfg.vocab_size, 96, 6, 1, 16)
    assert (cfg.num_hidden_layers, cfg.intermediate_size, cfg.max_position_embeddings) == \
        (ref_cfg.num_hidden_layers, ref_cfg.intermediate_size, ref_cfg.max_position_embeddings)
    assert cfg.rms_norm_eps == pytest.approx(ref_cfg.rms_norm_eps) and cfg.rope_theta == ref_cfg.rope_theta
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.tie_word_embeddings) == (1, [2], False)


# Analytic bounds, not measured ones: the tiny model's weights are under 1 in magnitude,
# so F16 rounds each by at most 2^-11 (5e-4) and Q8_0 by half a step of max|w| / 127 per
# 32 values (under 4e-3); the tolerances are twice and five times those.
@pytest.mark.parametrize("quant,tol", [("F16", 1e-3), ("Q8_0", 2e-2)])
def test_quantized_gguf_is_close_to_the_original(tiny, quant, tol):
    hf, files = tiny
    _, ref = HFLoader().load(hf)
    _, weights = GGUFLoader().load(files[quant])
    for name in ref:
        torch.testing.assert_close(weights[name], ref[name], atol=tol, rtol=0, msg=name)


def test_quantized_gguf_equals_transformers_conversion(tiny):
    _, files = tiny
    _, weights = GGUFLoader().load(files["Q8_0"])
    ref = _transformers_gguf_tensors(files["Q8_0"])
    assert set(weights) == set(ref)
    for name in ref:
        assert torch.equal(weights[name], ref[name].float()), name


def test_tied_embeddings_when_there_is_no_output_tensor(tmp_path):
    hf = make_tiny_llama(tmp_path, tie_word_embeddings=True)
    cfg, weights = GGUFLoader().load(make_tiny_gguf(hf, tmp_path / "tied.gguf"))
    assert cfg.tie_word_embeddings and "lm_head.weight" not in weights


@pytest.mark.parametrize("keep", [0, 3, 20, 200, 0.5, -1])
def test_truncated_file_raises_model_load_error(tiny, tmp_path, keep):
    src = tiny[1]["Q8_0"].read_bytes()
    n = int(len(src) * keep) if isinstance(keep, float) else (len(src) + keep if keep < 0 else keep)
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(src[:n])
    with pytest.raises(ModelLoadError, match=str(bad)):
        GGUFLoader().load(bad)


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        GGUFLoader().load(bad)


def test_nan_weights_are_reported(tiny, tmp_path):
    import gguf

    path = tiny[1]["F32"]
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    data = bytearray(path.read_bytes())
    data[t.data_offset:t.data_offset + 4] = np.float32(np.nan).tobytes()
    bad = tmp_path / "nan.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="blk.0.ffn_up.weight holds NaN"):
        GGUFLoader().load(bad)


def test_unsupported_architecture(tmp_path):
    import gguf

    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="architecture 'phi2' is not supported"):
        GGUFLoader().load(path)


def _transformers_gguf_tensors(path):
    """transformers' own GGUF conversion (what from_pretrained(gguf_file=...) loads).

    ``AutoModelForCausalLM.from_pretrained`` would do the same but needs ``accelerate``
    for GGUF files; ``load_gguf_checkpoint`` is the function it calls for the tensors.
    """
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]


@pytest.mark.real_model
def test_smollm2_equals_transformers_gguf_conversion(smollm2_path):
    from transformers import AutoConfig

    cfg, weights = GGUFLoader().load(smollm2_path)
    ref = _transformers_gguf_tensors(smollm2_path)
    assert set(weights) == set(ref)
    for name in ref:
        assert torch.equal(weights[name], ref[name].float()), name
    hf = AutoConfig.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name, local_files_only=True)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == \
        (hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers) == (49152, 576, 1536, 30)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.rms_norm_eps == hf.rms_norm_eps and cfg.rope_theta == hf.rope_parameters["rope_theta"] == 1e5
    assert cfg.max_position_embeddings == hf.max_position_embeddings == 8192
    assert cfg.tie_word_embeddings and hf.tie_word_embeddings
    assert (cfg.bos_token_id, cfg.eos_token_id) == (1, [2])


@pytest.mark.real_model
def test_truncated_smollm2_raises_model_load_error(smollm2_path, tmp_path):
    bad = tmp_path / "smol-cut.gguf"
    with open(smollm2_path, "rb") as f:
        bad.write_bytes(f.read(40 << 20))
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        GGUFLoader().load(bad)
