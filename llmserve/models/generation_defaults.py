"""A model's recommended sampling defaults, from its ``generation_config.json``, as vLLM's
``--generation-config auto`` (its default) reads them: what a request leaves out of
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_tokens``
(HF's ``max_new_tokens``) comes from there. Qwen3 recommends 0.6 / 0.95 / 20, and without
them a reasoning model sampled at 1.0 loops. Values equal to transformers'
``GenerationConfig`` defaults are no recommendation (its ``to_diff_dict`` drops them too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmserve.models.errors import ModelLoadError
from llmserve.models.files import read_json_object

FILE = "generation_config.json"
KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
        "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
HF_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0}


def sampling_defaults(config: dict[str, Any]) -> dict[str, float | int]:
    """Our SamplingParams' names and values for what ``config`` recommends."""
    out: dict[str, float | int] = {}
    for hf, ours in KEYS.items():
        v = config.get(hf)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v != HF_DEFAULTS.get(hf):
            out[ours] = v
    return out


def read_sampling_defaults(folder: Path) -> dict[str, float | int]:
    """The defaults in ``folder``'s generation_config.json; none without one."""
    path = Path(folder) / FILE
    if not path.is_file():
        return {}
    return sampling_defaults(read_json_object(path, "the generation config", ModelLoadError))
