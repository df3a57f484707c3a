"""Hugging Face folder loader: ``config.json`` plus one or more ``*.safetensors``.

Tensors keep their HF names; anything not fp32 is converted to fp32, and fp32
tensors stay memory-mapped (``safetensors`` maps the file), which is what makes
the GGUF conversion cache fast to reopen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import torch

from llmserve.models.config import ModelConfig
from llmserve.models.families import SUPPORTED_MODEL_TYPES, UnsupportedModel, text_config_of, text_weight_name
from llmserve.models.files import read_json
from llmserve.models.generation_defaults import sampling_defaults
from llmserve.models.loader import ModelLoadError, UnsupportedFamily, check_shapes, check_weights

INDEX = "model.safetensors.index.json"
__all__ = ["SUPPORTED_MODEL_TYPES", "HFLoader", "read_hf_config"]
T = TypeVar("T")


def read_hf_config(folder: Path) -> ModelConfig:
    """The ``ModelConfig`` of a HF folder; ``generation_config.json`` may add stop ids."""
    path = folder / "config.json"
    try:
        d: dict[str, Any] = read_json(path)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read config ({e})") from e
    try:
        config = ModelConfig.from_hf_dict(text_config_of(d), name=folder.name)
    except UnsupportedModel as e:
        raise UnsupportedFamily(f"{path}: {e}") from e
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{path}: invalid config ({type(e).__name__}: {e})") from e
    gen = folder / "generation_config.json"
    if gen.is_file():
        try:
            g = read_json(gen)
            eos = g.get("eos_token_id")
        except (OSError, ValueError, AttributeError) as e:
            raise ModelLoadError(f"{gen}: cannot read ({e})") from e
        extra = [eos] if isinstance(eos, int) else list(eos or [])
        config.eos_token_id = list(dict.fromkeys([*config.eos_token_id, *extra]))
        config.sampling_defaults = sampling_defaults(g)  # (the file read once, for both)
    return config


def safetensors_files(folder: Path) -> list[Path]:
    """The shards of a folder: those the index names, else every ``*.safetensors``."""
    index = folder / INDEX
    if index.is_file():
        try:
            names = sorted(set(read_json(index)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise ModelLoadError(f"{index}: cannot read the shard index ({e})") from e
        files = [folder / n for n in names]
        if missing := [f.name for f in files if not f.is_file()]:
            raise ModelLoadError(f"{index}: names shards that are missing: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        hint = " (pytorch_model.bin is not supported; convert it to safetensors)" \
            if (folder / "pytorch_model.bin").exists() else ""
        raise ModelLoadError(f"{folder}: no *.safetensors files{hint}")
    return files


def load_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the shards as fp32 on CPU; a bad shard raises naming it."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            shard = load_file(f, device="cpu")
        except Exception as e:  # SafetensorError, OSError, or a header that does not parse
            raise ModelLoadError(f"{f}: corrupt or truncated safetensors file ({e})") from e
        for name, t in shard.items():
            if name in weights:
                raise ModelLoadError(f"{f}: tensor {name} also appears in another shard")
            weights[name] = t if t.dtype == torch.float32 else t.float()
    return weights


def safetensors_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from the shards' headers, no weight read. Opening a shard checks
    its header against the file's size (a truncated or padded file fails), as ``load_file``'s would."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as shard:
                found = {name: tuple(shard.get_slice(name).get_shape()) for name in shard.keys()}
        except Exception as e:  # SafetensorError, OSError, or a header that does not parse
            raise ModelLoadError(f"{f}: corrupt or truncated safetensors file ({e})") from e
        if twice := sorted(set(found) & set(shapes)):
            raise ModelLoadError(f"{f}: tensor {twice[0]} also appears in another shard")
        shapes.update(found)
    return shapes


def decoder_tensors(path: Path, config: ModelConfig, tensors: dict[str, T]) -> dict[str, T]:
    """The checkpoint's tensors (or their shapes) as the decoder reads them: a multimodal
    checkpoint's text part renamed, a tied head dropped."""
    if "text_config" in read_json(path / "config.json"):  # a multimodal checkpoint: its decoder
        tensors = {new: w for name, w in tensors.items() if (new := text_weight_name(name)) is not None}
    if config.tie_word_embeddings:
        # One layout for the model code: a tied head is the embedding, never a copy.
        tensors.pop("lm_head.weight", None)
    return tensors


class HFLoader:
    """``WeightLoader`` for a Hugging Face folder of a supported family."""

    def can_load(self, path: Path) -> bool:
        return path.is_dir() and (path / "config.json").is_file()

    def check(self, path: Path) -> ModelConfig:
        config = read_hf_config(path)
        check_shapes(config, decoder_tensors(path, config, safetensors_shapes(safetensors_files(path))), path)
        return config

    def load(self, path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
        config = read_hf_config(path)
        weights = decoder_tensors(path, config, load_safetensors(safetensors_files(path)))
        check_weights(config, weights, path)
        return config, weights
