"""Tiny random models of every supported family, built with transformers' own config classes.

Each is saved as a Hugging Face safetensors folder and used as the oracle: transformers runs
the same folder. Widths are small so a family's oracle test runs in seconds; sliding windows
are narrower than the test prompts so that windows are exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 384
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            bos_token_id=None, eos_token_id=None, pad_token_id=0)

# family -> (transformers config class name, model class name, config fields over BASE)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=12, head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        use_sliding_window=True, sliding_window=10, max_window_layers=1, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=True)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=12, attn_logit_softcapping=2.0,
        final_logit_softcapping=20.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, query_pre_attn_scalar=16, sliding_window=12, num_hidden_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        partial_rotary_factor=0.75, original_max_position_embeddings=256, max_position_embeddings=1024,
        rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                      "long_factor": [2.0, 2.5, 3.0, 4.0, 5.0, 6.0]})),
}
# What a GGUF can say of each family (llama.cpp's metadata): Mistral converts to the llama
# architecture without its window, Qwen2's window is not stored, Gemma's attention scale is
# head_dim ** -0.5 and Gemma 3's window pattern is every sixth layer full.
GGUF_VARIANTS: dict[str, dict[str, Any]] = {
    "mistral": dict(sliding_window=None),
    "qwen2": dict(use_sliding_window=False),
    "gemma2": dict(query_pre_attn_scalar=16),
    "gemma3": dict(query_pre_attn_scalar=16, num_hidden_layers=6, layer_types=None),
}
# Gemma applies its norms as 1 + w: random weights around 0 there, around 1 elsewhere
NORM_CENTRE = {"gemma2": 0.0, "gemma3": 0.0}


def make_family(family: str, folder: Path, seed: int = 0, **overrides: Any):
    """Write the tiny ``family`` model to ``folder``; returns the transformers model.
    ``overrides``: config fields over the family's."""
    import transformers

    cfg_cls, model_cls, fields = FAMILIES[family]
    config = getattr(transformers, cfg_cls)(**{**BASE, **fields, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, model_cls)(config).eval()
        with torch.no_grad():  # random norms and biases: a model that ignores one is caught
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(NORM_CENTRE.get(family, 1.0) + 0.1 * torch.randn_like(p))
                elif name.endswith(".bias"):
                    p.copy_(0.1 * torch.randn_like(p))
                elif name.endswith("embed_tokens.weight"):
                    p.mul_(20.0 if family.startswith("gemma") else 10.0)  # logits far from uniform
    model.save_pretrained(folder)
    return model


def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and their logprobs, each step a full forward pass without a
    cache: the model's definition, free of any cache implementation (Gemma 2's sliding cache in
    ``generate`` gives other logits for prompts longer than the window)."""
    seq, lps = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            logp = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1].float(), -1)
            seq.append(int(logp.argmax()))
            lps.append(logp[seq[-1]].item())
    return seq[len(ids):], lps
