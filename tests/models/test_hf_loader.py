"""Hugging Face folder loader: transformers' own loading of the same folder is the oracle."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmserve.models.hf_loader import HFLoader
from llmserve.models.loader import ModelLoadError, expected_weight_shapes
from tests.helpers import make_tiny_llama


def _transformers_state_dict(folder):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


@pytest.mark.parametrize("tie", [False, True])
def test_weights_equal_transformers(tmp_path, tie):
    folder = make_tiny_llama(tmp_path, tie_word_embeddings=tie)
    cfg, weights = HFLoader().load(folder)
    ref = _transformers_state_dict(folder)
    assert set(weights) == set(expected_weight_shapes(cfg))
    assert set(ref) - set(weights) == ({"lm_head.weight"} if tie else set())
    for name, t in weights.items():
        assert t.dtype == torch.float32 and torch.equal(t, ref[name]), name
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim, cfg.tie_word_embeddings) == (384, 64, 2, 4, 2, 16, tie)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.name) == (1, [2], "tiny-llama")


def test_bf16_checkpoint_comes_out_fp32(tmp_path):
    folder = make_tiny_llama(tmp_path, dtype=torch.bfloat16)
    _, weights = HFLoader().load(folder)
    raw = load_file(folder / "model.safetensors")
    assert raw["model.norm.weight"].dtype == torch.bfloat16
    for name, t in weights.items():
        assert t.dtype == torch.float32 and torch.equal(t, raw[name].float()), name


def test_sharded_checkpoint_with_index(tmp_path):
    from transformers import LlamaForCausalLM

    folder = make_tiny_llama(tmp_path)
    _, whole = HFLoader().load(folder)
    sharded = tmp_path / "sharded"
    LlamaForCausalLM.from_pretrained(folder).save_pretrained(sharded, max_shard_size="50KB")
    (sharded / "model.safetensors").unlink(missing_ok=True)
    assert len(list(sharded.glob("*.safetensors"))) > 1 and (sharded / "model.safetensors.index.json").is_file()
    _, weights = HFLoader().load(sharded)
    assert set(weights) == set(whole)
    assert all(torch.equal(weights[n], whole[n]) for n in whole)


def test_missing_tensor_is_named(tmp_path):
    folder = make_tiny_llama(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        HFLoader().load(folder)


def test_config_that_does_not_match_the_weights(tmp_path):
    folder = make_tiny_llama(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"gate_proj.weight has shape \(128, 64\), config implies \(96, 64\)"):
        HFLoader().load(folder)


def test_truncated_safetensors_is_named(tmp_path):
    folder = make_tiny_llama(tmp_path)
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match=f"{f}: corrupt or truncated"):
        HFLoader().load(folder)


def test_unsupported_or_incomplete_folders(tmp_path):
    folder = make_tiny_llama(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))
    with pytest.raises(ModelLoadError, match="model family 'falcon' is not supported "
                                             r"\(supported: llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, gemma3\)"):
        HFLoader().load(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        HFLoader().load(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read config"):
        HFLoader().load(folder)


def test_generation_config_adds_stop_ids(tmp_path):
    folder = make_tiny_llama(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    cfg, _ = HFLoader().load(folder)
    assert cfg.eos_token_id == [2, 0]
