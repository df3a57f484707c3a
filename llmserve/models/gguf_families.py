"""Each supported GGUF architecture: its tensor names under HF names, and the ``ModelConfig``
fields its metadata implies beyond Llama's, as llama.cpp's ``convert_hf_to_gguf.py`` writes
them and ``llama.cpp`` reads them back.

What the converter changes and we undo or account for:

- llama (and Mistral, converted as llama): Q/K rows permuted to GGML's interleaved RoPE
  (undone in ``gguf_loader``); Llama 3.1's rope scaling stored as ``rope_freqs`` divisors.
- gemma2 / gemma3: every ``*norm.weight`` stored as ``1 + w``, so the model reads them
  with no offset; ``query_pre_attn_scalar`` is not stored: llama.cpp scales by
  ``head_dim ** -0.5`` (``hidden / heads`` for the 27B models), and so do we; sliding layers
  every 2nd (Gemma 2) / all but every 6th (Gemma 3) unless ``sliding_window_pattern`` says.
- phi3: q/k/v fused as ``attn_qkv``, gate and up fused as ``ffn_up``; LongRoPE's factors
  stored as ``rope_factors_short`` / ``rope_factors_long`` tensors.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
PERMUTED_QK = ("llama",)  # archs whose Q/K rows llama.cpp interleaves
# tensors that hold rope constants, not weights
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA_NAMES = {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3_NAMES = {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
LAYER_NAMES = {"gemma2": _GEMMA_NAMES, "gemma3": _GEMMA_NAMES, "phi3": _PHI3_NAMES}
_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def layer_names(arch: str) -> dict[str, str]:
    return LAYER_NAMES.get(arch, _LAYER_NAMES)


def _swa_layers(meta: dict[str, Any], arch: str, n_layers: int, every: int) -> list[str]:
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer
        return ["sliding_attention" if p else "full_attention" for p in pattern]
    n = int(pattern or every)
    return ["sliding_attention" if i % n < n - 1 else "full_attention" for i in range(n_layers)]


def arch_fields(arch: str, meta: dict[str, Any], base: dict[str, Any],
                read: Callable[[str], np.ndarray | None]) -> dict[str, Any]:
    """``ModelConfig`` fields of ``arch`` beyond the common ones in ``base`` (already read).
    ``read(name)`` is a rope tensor's values, or None when the file has none."""
    key = lambda k: meta.get(f"{arch}.{k}")  # noqa: E731
    n_layers, head_dim = base["num_hidden_layers"], base["head_dim"]
    window = int(key("attention.sliding_window") or 0)
    out: dict[str, Any] = {"family": {"gemma3": "gemma3", "gemma2": "gemma2"}.get(arch, arch)}
    if arch == "llama" and (factors := read("rope_freqs.weight")) is not None:
        out["rope_scaling"] = {"rope_type": "freq_factors", "factors": [float(f) for f in factors]}
    if arch == "qwen2":
        out["qkv_bias"] = True
    if arch == "qwen3":
        out["qk_norm"] = True
    if arch in ("gemma2", "gemma3"):
        hidden = base["hidden_size"]
        scalar = hidden / base["num_attention_heads"] if n_layers == _27B_LAYERS[arch] else head_dim
        out.update(hidden_act="gelu_tanh", sandwich_norm=True, embed_scale=float(hidden) ** 0.5,
                   attn_scale=float(scalar) ** -0.5, qk_norm=arch == "gemma3")
        if (cap := key("final_logit_softcapping")):
            out["logit_softcap"] = float(cap)
        if arch == "gemma2" and (cap := key("attn_logit_softcapping")):
            out["attn_softcap"] = float(cap)
        if window:
            out.update(sliding_window=window, layer_types=_swa_layers(meta, arch, n_layers, 2 if arch == "gemma2" else 6))
            if arch == "gemma3":
                out["rope_local_theta"] = float(key("rope.freq_base_swa") or 10000.0)
    if arch == "phi3":
        rope_dim = int(key("rope.dimension_count") or head_dim)
        out["partial_rotary_factor"] = rope_dim / head_dim
        short, long = read("rope_factors_short.weight"), read("rope_factors_long.weight")
        if short is not None and long is not None:
            out["rope_scaling"] = {"rope_type": "longrope", "short_factor": [float(f) for f in short],
                                   "long_factor": [float(f) for f in long],
                                   "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
                                   "attention_factor": float(key("rope.scaling.attn_factor") or 1.0)}
        if window:
            out.update(sliding_window=window, layer_types=["sliding_attention"] * n_layers)
    return out
