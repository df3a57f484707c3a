"""Weight loaders: turn a model file or folder into (ModelConfig, HF-named fp32 tensors).

Every loader returns tensors under Hugging Face names
(``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``,
``model.layers.{i}.mlp.gate_proj.weight``, ``model.norm.weight``, ``lm_head.weight``
when untied, ...), in the layout ``transformers`` uses, so the model code has a
single naming and layout to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from llmserve.models.config import ModelConfig
from llmserve.models.errors import ModelLoadError, UnsupportedFamily  # noqa: F401 - where callers import them


class WeightLoader(Protocol):
    """Reads one kind of model source.

    ``can_load(path)`` must be cheap (look at a suffix or a file's presence);
    ``load(path)`` returns the config and every weight as a CPU tensor, or raises
    ``ModelLoadError`` with a message naming the file and the problem; ``check(path)``
    raises as ``load`` would for what headers show (a truncated file, a tensor the config
    needs missing or misshapen) without reading the weights, and returns the config.
    """

    def can_load(self, path: Path) -> bool: ...

    def check(self, path: Path) -> ModelConfig: ...

    def load(self, path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]: ...


def expected_weight_shapes(config: ModelConfig, weights: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor the config's decoder needs, by HF name, with its shape. Where ``weights``
    (tensors or shapes by name) hold a layer's fused q/k/v or gate/up matrix (Phi-3), that
    name replaces the parts."""
    c, weights = config, weights or {}
    q, kv, d, hid = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.head_dim, c.hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, hid),
        "model.norm.weight": (hid,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, hid)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if c.sandwich_norm:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        shapes.update({p + n + ".weight": (hid,) for n in norms})
        if p + "self_attn.qkv_proj.weight" in weights:
            shapes[p + "self_attn.qkv_proj.weight"] = (q + 2 * kv, hid)
        else:
            shapes.update({p + "self_attn.q_proj.weight": (q, hid), p + "self_attn.k_proj.weight": (kv, hid),
                           p + "self_attn.v_proj.weight": (kv, hid)})
        if c.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if c.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        shapes[p + "self_attn.o_proj.weight"] = (hid, q)
        if p + "mlp.gate_up_proj.weight" in weights:
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * c.intermediate_size, hid)
        else:
            shapes.update({p + "mlp.gate_proj.weight": (c.intermediate_size, hid),
                           p + "mlp.up_proj.weight": (c.intermediate_size, hid)})
        shapes[p + "mlp.down_proj.weight"] = (hid, c.intermediate_size)
    return shapes


def check_weights(config: ModelConfig, weights: dict[str, torch.Tensor], source: Path | str) -> None:
    """Raise ``ModelLoadError`` unless ``weights`` has every tensor the config implies, shaped right.

    Loaders call this so that a checkpoint that does not match its config fails
    here, naming the file and the tensor, instead of deep inside the model.
    Extra tensors (biases, rotary caches) are allowed.
    """
    check_shapes(config, {name: tuple(w.shape) for name, w in weights.items()}, source)


def check_shapes(config: ModelConfig, shapes: Mapping[str, tuple[int, ...]], source: Path | str) -> None:
    """``check_weights`` on shapes alone, as a file's header gives them (``llmserve pull``)."""
    expected = expected_weight_shapes(config, shapes)
    missing = [n for n in expected if n not in shapes]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{source}: missing tensors {missing[:5]}{more}")
    for name, shape in expected.items():
        got = tuple(shapes[name])
        if got != shape:
            raise ModelLoadError(f"{source}: tensor {name} has shape {got}, config implies {shape}")
