"""The supported model families: how each one's Hugging Face config chooses the decoder's parts.

A family is a function from its ``config.json`` dictionary to the ``ModelConfig`` fields
in which it differs from Llama (``config.ARCH_FIELDS`` plus ``rope_scaling``). Both the
Hub's files (``rope_theta``, ``rope_scaling``, ``rope_local_base_freq``) and what
transformers 5 writes (``rope_parameters``, nested per layer type for Gemma 3) are read.
"""

from __future__ import annotations

import math
from typing import Any, Callable


class UnsupportedModel(ValueError):
    """A config of a family (or a variant of one) the decoder does not implement."""


# What rope.py computes. Not "dynamic" (dynamic NTK): its base follows the sequence's length,
# so a cached key, or one request of a batch, would be rotated by another base than the next.
ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


def refuse_rope_type(kind: str) -> None:
    if kind not in ROPE_TYPES:
        raise UnsupportedModel(f"rope scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")


def _scaling(d: dict[str, Any], params: dict[str, Any] | None = None,
             longrope: tuple[str, ...] = ("su",)) -> dict[str, Any] | None:
    """HF ``rope_scaling`` (``rope_type`` and its constants), or None for plain RoPE.
    ``longrope``: the family's old names of LongRoPE."""
    params = d.get("rope_parameters") if params is None else params
    s = d.get("rope_scaling") or params or None
    if not isinstance(s, dict):
        return None
    s = {k: v for k, v in s.items() if k not in ("rope_theta", "partial_rotary_factor")}
    kind = s.pop("type", None) or s.get("rope_type") or "default"
    kind = "longrope" if kind in longrope else kind
    refuse_rope_type(kind)
    if kind == "default":
        return None
    s["rope_type"] = kind
    if kind == "yarn":
        # transformers' standardize_rope_params: a top-level original length wins over the
        # scaling's own, the model's length is the fallback; no factor means their ratio
        if d.get("original_max_position_embeddings") is not None:
            s["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        length = d.get("max_position_embeddings", 2048)
        s.setdefault("original_max_position_embeddings", length)
        if s.get("factor") is None:
            s["factor"] = length / s["original_max_position_embeddings"]
    if s["rope_type"] == "longrope":
        s.setdefault("original_max_position_embeddings", d.get("original_max_position_embeddings"))
        if s.get("factor") is None:
            s["factor"] = d["max_position_embeddings"] / s["original_max_position_embeddings"]
        if s.get("attention_factor") is None:
            f, orig = s["factor"], s["original_max_position_embeddings"]
            s["attention_factor"] = 1.0 if f <= 1 else math.sqrt(1 + math.log(f) / math.log(orig))
    return s


def _act(d: dict[str, Any]) -> str:
    act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
    if act in ("silu", "swish"):
        return "silu"
    if act in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new"):
        return "gelu_tanh"
    if act == "gelu":
        return "gelu"
    raise UnsupportedModel(f"activation {act!r} is not supported")


def _layer_types(d: dict[str, Any], default: Callable[[int], bool]) -> list[str]:
    if d.get("layer_types"):
        return list(d["layer_types"])
    n = int(d["num_hidden_layers"])
    return ["sliding_attention" if default(i) else "full_attention" for i in range(n)]


def _window_everywhere(d: dict[str, Any]) -> dict[str, Any]:
    """Mistral and Phi-3: when ``sliding_window`` is set, every layer slides."""
    w = d.get("sliding_window")
    return {"sliding_window": int(w), "layer_types": ["sliding_attention"] * int(d["num_hidden_layers"])} \
        if w else {}


def _llama(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("attention_bias") or d.get("mlp_bias"):
        raise UnsupportedModel("Llama with attention_bias or mlp_bias is not supported")
    return {"family": "llama", "rope_scaling": _scaling(d)}


def _mistral(d: dict[str, Any]) -> dict[str, Any]:
    return {"family": "mistral", "rope_scaling": _scaling(d), **_window_everywhere(d)}


def _qwen(d: dict[str, Any], family: str) -> dict[str, Any]:
    out: dict[str, Any] = {"family": family, "rope_scaling": _scaling(d),
                           "qkv_bias": family == "qwen2" or bool(d.get("attention_bias")),
                           "qk_norm": family == "qwen3"}
    if d.get("use_sliding_window") and d.get("sliding_window"):
        first = int(d.get("max_window_layers", 0))
        out.update(sliding_window=int(d["sliding_window"]), layer_types=_layer_types(d, lambda i: i >= first))
    return out


def _gemma(d: dict[str, Any], family: str) -> dict[str, Any]:
    params = d.get("rope_parameters") or {}
    nested = "full_attention" in params
    full = params.get("full_attention", {}) if nested else params
    local = params.get("sliding_attention", {}) if nested else {}
    every = 2 if family == "gemma2" else int(d.get("sliding_window_pattern") or 6)
    cap = d.get("attn_logit_softcapping")
    out: dict[str, Any] = {
        "family": family, "hidden_act": _act(d), "norm_offset": 1.0, "sandwich_norm": True,
        "embed_scale": float(d["hidden_size"]) ** 0.5,
        "attn_scale": float(d.get("query_pre_attn_scalar") or 256) ** -0.5,
        "attn_softcap": float(cap) if cap else None,
        "logit_softcap": float(d["final_logit_softcapping"]) if d.get("final_logit_softcapping") else None,
        "qk_norm": family == "gemma3",
        "rope_scaling": _scaling(d, full),
    }
    if family == "gemma3":
        out["rope_theta"] = float(full.get("rope_theta") or d.get("rope_theta") or 1e6)
        out["rope_local_theta"] = float(local.get("rope_theta") or d.get("rope_local_base_freq") or 10000.0)
    if d.get("sliding_window"):
        out.update(sliding_window=int(d["sliding_window"]), layer_types=_layer_types(d, lambda i: bool((i + 1) % every)))
    return out


def _phi3(d: dict[str, Any]) -> dict[str, Any]:
    params = d.get("rope_parameters") or {}
    # "yarn" too, as transformers' Phi3Config reads it: early Phi-3 configs' name of LongRoPE
    return {"family": "phi3", "rope_scaling": _scaling(d, longrope=("su", "yarn")),
            "partial_rotary_factor": float(d.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0),
            **_window_everywhere(d)}


# model_type -> its mapping; the keys are what a refusal lists as supported
FAMILIES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": lambda d: _qwen(d, "qwen2"),
    "qwen3": lambda d: _qwen(d, "qwen3"),
    "gemma2": lambda d: _gemma(d, "gemma2"),
    "gemma3_text": lambda d: _gemma(d, "gemma3"),
    "phi3": _phi3,
}
# Multimodal checkpoints whose text decoder is a supported family: the vision tower is left
# out, the decoder's config and weights are read from their place in the checkpoint.
_TEXT_OF = {"gemma3": ("gemma3_text", "Gemma3TextConfig")}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES) + tuple(_TEXT_OF)  # what a refusal lists
_GENERATORS = ("ForCausalLM", "ForConditionalGeneration")


def arch_from_hf(d: dict[str, Any]) -> dict[str, Any]:
    """The family-chosen ``ModelConfig`` fields of a HF config dictionary."""
    model_type = d.get("model_type", "llama")
    if model_type not in FAMILIES:
        raise UnsupportedModel(f"model family {model_type!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for arch in d.get("architectures") or []:
        # a reward, classification or embedding head of a family generates nothing
        if isinstance(arch, str) and not arch.endswith(_GENERATORS):
            raise UnsupportedModel(f"architecture {arch!r} is not supported: the engine generates text "
                                   f"(a checkpoint whose architecture ends in {' or '.join(_GENERATORS)})")
    out = FAMILIES[model_type](d)
    if (s := out.get("rope_scaling")) and s["rope_type"] == "yarn":
        out["max_position_embeddings"] = yarn_context(s, int(d.get("max_position_embeddings", 2048)))
    return out


def yarn_context(scaling: dict[str, Any], max_positions: int) -> int:
    """The positions a YaRN model serves: its original context stretched ``factor`` times, as
    vLLM derives it (Qwen's cards add the scaling to a config that still says the original)."""
    stretched = int(float(scaling["original_max_position_embeddings"]) * float(scaling["factor"]))
    return max(max_positions, stretched)


_TEXT_PREFIXES = ("language_model.model.", "model.language_model.")


def text_config_of(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` itself, or the text decoder's full config of a multimodal ``d`` (the Hub's
    ``text_config`` lists only what differs from the defaults: transformers fills them)."""
    if d.get("model_type") not in _TEXT_OF or not isinstance(d.get("text_config"), dict):
        return d
    import transformers

    model_type, cls = _TEXT_OF[d["model_type"]]
    text = getattr(transformers, cls)(**d["text_config"]).to_dict()
    keep = {k: d[k] for k in ("tie_word_embeddings", "eos_token_id", "bos_token_id") if k in d}
    return {**text, **keep, "model_type": model_type}


def text_weight_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name as the text decoder's, None for the vision parts."""
    if name in ("language_model.lm_head.weight", "lm_head.weight"):
        return "lm_head.weight"
    for prefix in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix):]
    return None
