"""Weight loaders: turn a model file or folder into (ModelConfig, HF-named fp32 tensors).

Every loader returns tensors under Hugging Face Llama names
(``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``,
``model.layers.{i}.mlp.gate_proj.weight``, ``model.norm.weight``, ``lm_head.weight``
when untied, ...), in the layout ``transformers`` uses, so the model code has a
single naming and layout to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from llmserve.models.config import ModelConfig


class WeightLoader(Protocol):
    """Reads one kind of model source.

    ``can_load(path)`` must be cheap (look at a suffix or a file's presence);
    ``load(path)`` returns the config and every weight as a CPU tensor, or raises
    ``ModelLoadError`` with a message naming the file and the problem.
    """

    def can_load(self, path: Path) -> bool: ...

    def load(self, path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]: ...


class ModelLoadError(ValueError):
    """A model file or folder is missing, truncated, corrupt or unsupported."""
