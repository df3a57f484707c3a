"""Write a tiny HF folder of any supported family as GGUF the way llama.cpp's
``convert_hf_to_gguf.py`` does: its architecture names and metadata keys, the tensor names
from gguf-py's own ``TensorNameMap`` (what the converter maps with), Q/K permuted for the
llama architecture, Gemma's norms stored as 1 + w, Llama 3's rope scaling as ``rope_freqs``
and Phi-3's LongRoPE as factor tensors. Independent of the loader under test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tests.helpers import _llama_cpp_permute

ARCH = {"llama": "LLAMA", "mistral": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "gemma2": "GEMMA2",
        "gemma3_text": "GEMMA3", "phi3": "PHI3"}


def _llama3_freq_factors(p: dict, dim: int) -> np.ndarray:
    """The converter's rope_freqs for Llama 3 scaling (LlamaModel.generate_extra_tensors)."""
    freqs = 1.0 / (p["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high, old = p["factor"], p["low_freq_factor"], p["high_freq_factor"], \
        p["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(folder: Path, out: Path, quant: str = "F32", tokenizer_from: Path | None = None) -> Path:
    """``tokenizer_from``: a GGUF whose ``tokenizer.*`` metadata to copy (a servable file)."""
    import gguf
    from safetensors.numpy import load_file

    c = json.loads((folder / "config.json").read_text())
    arch_enum = getattr(gguf.MODEL_ARCH, ARCH[c["model_type"]])
    arch = gguf.MODEL_ARCH_NAMES[arch_enum]
    n_layers, n_head, n_kv = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // n_head
    params = c.get("rope_parameters") or {}
    full = params.get("full_attention", params)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(folder.name)
    w.add_block_count(n_layers)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(full["rope_theta"])
    if "sliding_attention" in params:
        w.add_rope_freq_base_swa(params["sliding_attention"]["rope_theta"])
    if c.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    extra: dict[str, np.ndarray] = {}
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
    if arch in ("gemma2", "gemma3") and c.get("sliding_window"):
        w.add_sliding_window(c["sliding_window"])
    if arch == "llama" and full.get("rope_type") == "llama3":
        extra["rope_freqs.weight"] = _llama3_freq_factors(full, head_dim)
    if arch == "phi3":
        rope_dims = int(full.get("partial_rotary_factor", 1.0) * c["hidden_size"]) // n_head
        orig = full.get("original_max_position_embeddings") or c["original_max_position_embeddings"]
        scale = c["max_position_embeddings"] / orig
        w.add_rope_dimension_count(rope_dims)
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
        w.add_sliding_window(c.get("sliding_window") or 0)
        extra["rope_factors_long.weight"] = np.array(full["long_factor"], dtype=np.float32)
        extra["rope_factors_short.weight"] = np.array(full["short_factor"], dtype=np.float32)

    if tokenizer_from is not None:
        for key, f in gguf.GGUFReader(str(tokenizer_from)).fields.items():
            if key.startswith("tokenizer."):
                w.add_key_value(key, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    names = gguf.get_tensor_name_map(arch_enum, n_layers)
    qtype = getattr(gguf.GGMLQuantizationType, quant)
    for name, arr in load_file(str(folder / "model.safetensors")).items():
        if arch == "gemma2" and name == "lm_head.weight":
            continue
        arr = arr.astype(np.float32)
        stem, suffix = name.rsplit(".", 1)
        gname = f"{names.get_name(stem)}.{suffix}"
        if arch == "llama" and ".self_attn.q_proj." in name:
            arr = _llama_cpp_permute(arr, n_head)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            arr = _llama_cpp_permute(arr, n_kv)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            arr = arr + 1
        if arr.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, arr)
        else:
            w.add_tensor(gname, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    for gname, arr in extra.items():
        w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
