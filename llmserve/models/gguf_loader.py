"""GGUF loader: llama.cpp's single-file format, dequantized to fp32 under HF names.

Three things differ from a Hugging Face checkpoint and are undone here:

- names: ``blk.{i}.attn_q.weight`` instead of ``model.layers.{i}.self_attn.q_proj.weight``;
- shapes: GGUF lists dimensions fastest-first (``ne``), the reverse of torch;
- Q and K rows: llama.cpp's ``convert_hf_to_gguf.py`` permutes the rows of
  ``attn_q``/``attn_k`` from HF's "rotate half" RoPE layout to GGML's interleaved
  one. We apply the inverse (as ``transformers``' ``LlamaTensorProcessor`` does),
  so the model code sees exactly what ``transformers`` would load.

A GGUF file is untrusted input: any failure while parsing it becomes a
``ModelLoadError`` that names the file.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmserve.models.config import ModelConfig
from llmserve.models.families import UnsupportedModel, refuse_rope_type, yarn_context
from llmserve.models.gguf_families import PERMUTED_QK, ROPE_TENSORS, SUPPORTED_ARCHITECTURES, arch_fields, layer_names
from llmserve.models.loader import ModelLoadError, UnsupportedFamily, check_shapes, check_weights
from llmserve.models.rope_yarn import attention_factor

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor, or None when it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    names = layer_names(arch)
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    return None


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (GGML interleaved RoPE → HF rotate-half).

    llama.cpp viewed each head's rows as (2, head_dim/2) and swapped the axes; we
    view them as (head_dim/2, 2) and swap back. Works for weights and biases.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _open(path: Path) -> Any:
    import gguf  # deferred: importing it costs ~0.3 s and only this loader needs it

    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # the reader fails in many ways on a truncated or corrupt file
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e})") from e


def _fields(reader: Any, path: Path) -> dict[str, Any]:
    """Scalar and string metadata; large arrays (token lists) are skipped, their length kept."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0].name == "ARRAY" and len(field.data) > 16 \
                and not key.endswith("sliding_window_pattern"):
            out[key + "#len"] = len(field.data)
            continue
        try:
            out[key] = field.contents()
        except Exception as e:
            raise ModelLoadError(f"{path}: unreadable metadata field {key!r} ({e})") from e
    return out


def _rope_scaling(meta: dict[str, Any], arch: str, path: Path) -> dict[str, Any] | None:
    """HF ``rope_scaling`` from ``{arch}.rope.scaling.*`` (or the old ``rope.scale_linear``);
    a type rope.py does not compute is refused by name."""
    p = f"{arch}.rope."
    kind = meta.get(p + "scaling.type")
    factor = meta.get(p + "scaling.factor")
    if kind is None and meta.get(p + "scale_linear") is not None:
        kind, factor = "linear", meta[p + "scale_linear"]
    if kind in (None, "none"):
        return None
    try:
        refuse_rope_type(str(kind))
    except UnsupportedModel as e:
        raise UnsupportedFamily(f"{path}: {e}") from e
    out: dict[str, Any] = {"rope_type": str(kind)}
    for gguf_key, hf_key in (("scaling.factor", "factor"),
                             ("scaling.original_context_length", "original_max_position_embeddings"),
                             ("scaling.attn_factor", "attention_factor"),
                             ("scaling.yarn_beta_fast", "beta_fast"),
                             ("scaling.yarn_beta_slow", "beta_slow")):
        if (v := meta.get(p + gguf_key)) is not None:
            out[hf_key] = v
    if factor is not None:
        out["factor"] = float(factor)
    return _yarn(meta, arch, out, path) if kind == "yarn" else out


def _yarn(meta: dict[str, Any], arch: str, out: dict[str, Any], path: Path) -> dict[str, Any]:
    """YaRN's keys as llama.cpp's converter writes them, in transformers' terms."""
    p = f"{arch}.rope."
    length = int(meta.get(f"{arch}.context_length", 2048))
    out.setdefault("original_max_position_embeddings", length)  # transformers' fallbacks
    out.setdefault("factor", length / out["original_max_position_embeddings"])
    ext = meta.get(p + "scaling.yarn_ext_factor")
    if ext is not None and ext >= 0 and ext != 1:  # llama.cpp: negative is unset, 1 is the paper's ramp
        raise UnsupportedFamily(f"{path}: yarn_ext_factor {ext} is not supported (only 1, the paper's)")
    # llama.cpp multiplies its attention factor by attn_factor; yarn_attn_factor is the HF
    # config's attention_factor; yarn_log_multiplier its mscale_all_dim (mscale 1)
    multiplier = float(out.pop("attention_factor", 1.0))
    if (own := meta.get(p + "scaling.yarn_attn_factor")) is not None:
        out["attention_factor"] = float(own)
    if log_mul := meta.get(p + "scaling.yarn_log_multiplier"):
        out.update(mscale=1.0, mscale_all_dim=float(log_mul))
    if multiplier != 1.0:
        out["attention_factor"] = attention_factor(out) * multiplier
    return out


def config_from_reader(reader: Any, path: Path) -> ModelConfig:
    """Build a ``ModelConfig`` from GGUF metadata and tensor shapes."""
    meta = _fields(reader, path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedFamily(f"{path}: architecture {arch!r} is not supported "
                                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    names = {t.name: t for t in reader.tensors}

    def need(key: str) -> Any:
        if (v := meta.get(f"{arch}.{key}")) is None:
            raise ModelLoadError(f"{path}: missing metadata {arch}.{key}")
        return v

    hidden, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // n_head)
    # The embedding's rows are the model's vocabulary (it may be padded past the tokenizer's).
    embd = names.get("token_embd.weight")
    vocab = int(embd.shape[-1]) if embd is not None else meta.get("tokenizer.ggml.tokens#len")
    if not vocab:
        raise ModelLoadError(f"{path}: cannot tell the vocabulary size (no token_embd.weight, no tokens)")
    eos = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                  "tokenizer.ggml.eom_token_id") if meta.get(k) is not None]
    bos = meta.get("tokenizer.ggml.bos_token_id")

    def read(name: str) -> np.ndarray | None:
        return _dequantize(names[name], path).numpy() if name in names else None

    scaling = _rope_scaling(meta, arch, path)  # outside the try: a refusal keeps its own type
    try:
        context = int(meta.get(f"{arch}.context_length", 2048))
        base = dict(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_hidden_layers=int(need("block_count")),
            num_attention_heads=n_head,
            num_key_value_heads=int(meta.get(f"{arch}.attention.head_count_kv") or n_head),
            head_dim=head_dim,
            rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=yarn_context(scaling, context) if scaling and scaling["rope_type"] == "yarn"
            else context,
            tie_word_embeddings="output.weight" not in names,
            bos_token_id=int(bos) if bos is not None else None,
            eos_token_id=list(dict.fromkeys(eos)),
            name=path.stem,
            quantized_source=_block_quantized(reader),
        )
        return ModelConfig(**{**base, **arch_fields(arch, meta, base, read)})
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{path}: invalid model metadata ({e})") from e


_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}


def _block_quantized(reader: Any) -> bool:
    """True when every matrix is stored in a block-quantised type of at most 8 bits."""
    mats = [t for t in reader.tensors if len(t.shape) == 2 and t.name not in ROPE_TENSORS]
    return bool(mats) and all(t.tensor_type.name not in _FLOAT_TYPES for t in mats)


def _dequantize(tensor: Any, path: Path) -> torch.Tensor:
    """One GGUF tensor as an fp32 torch tensor in torch's dimension order."""
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # ne is fastest-first
    try:
        # A plain ndarray view: numpy.memmap slicing overhead dominates otherwise.
        arr = dequantize(np.asarray(tensor.data), tensor.tensor_type)
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot decode tensor {tensor.name} "
                             f"({tensor.tensor_type.name}, shape {shape}): {e}") from e
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, copy=True)  # detach from the read-only memory map
    return torch.from_numpy(arr)


def _decoder_tensors(reader: Any, path: Path) -> list[tuple[Any, str]]:
    """The file's tensors the decoder reads, with their HF names."""
    arch = _fields(reader, path)["general.architecture"]
    out = []
    for tensor in reader.tensors:
        if tensor.name in ROPE_TENSORS:
            continue  # read into the config's rope scaling
        name = hf_name(tensor.name, arch)
        if name is None:
            log.warning("%s: ignoring tensor %s (no counterpart in the decoder)", path, tensor.name)
            continue
        out.append((tensor, name))
    return out


class GGUFLoader:
    """``WeightLoader`` for ``.gguf`` files of the supported architectures."""

    def can_load(self, path: Path) -> bool:
        return path.is_file() and path.suffix.lower() == ".gguf"

    def read_config(self, path: Path) -> ModelConfig:
        """The config alone, without dequantizing anything."""
        return config_from_reader(_open(path), path)

    def check(self, path: Path) -> ModelConfig:
        """``load``'s checks on the header: opening maps every tensor (a truncated file fails),
        then the tensor names and shapes against the config's."""
        reader = _open(path)
        config = config_from_reader(reader, path)
        shapes = {name: tuple(int(d) for d in reversed(t.shape.tolist())) for t, name in _decoder_tensors(reader, path)}
        check_shapes(config, shapes, path)
        return config

    def load(self, path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
        reader = _open(path)
        config = config_from_reader(reader, path)
        arch = _fields(reader, path)["general.architecture"]
        weights: dict[str, torch.Tensor] = {}
        for tensor, name in _decoder_tensors(reader, path):
            w = _dequantize(tensor, path)
            if arch not in PERMUTED_QK:
                pass
            elif ".self_attn.q_proj." in name:
                w = torch.from_numpy(reverse_permute(w.numpy(), config.num_attention_heads).copy())
            elif ".self_attn.k_proj." in name:
                w = torch.from_numpy(reverse_permute(w.numpy(), config.num_key_value_heads).copy())
            # A sum is NaN/inf when any element is (or when weights are absurdly large,
            # which is as broken): one cheap pass instead of an isfinite mask.
            if not math.isfinite(w.sum().item()):
                raise ModelLoadError(f"{path}: tensor {tensor.name} holds NaN or infinite values (corrupt file?)")
            weights[name] = w
        check_weights(config, weights, path)
        return config, weights
