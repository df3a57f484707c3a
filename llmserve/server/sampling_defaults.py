"""The sampling defaults an instance gives what a request leaves out (``--generation-config``,
vLLM's flag and meaning): ``auto`` (default) the model's generation_config.json
recommendations (``models/generation_defaults.py``), ``vllm`` none (OpenAI's defaults), or
the generation_config.json in a given folder. A field the request gives always wins."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from llmserve.models.generation_defaults import read_sampling_defaults

log = logging.getLogger(__name__)


def sampling_defaults(engine: Any, setting: str) -> dict[str, Any]:
    if setting == "vllm":
        return {}
    found = dict(getattr(engine, "sampling_defaults", None) or {}) if setting == "auto" \
        else read_sampling_defaults(Path(setting))
    if found:
        log.warning("sampling defaults for what a request leaves out, from %s generation_config.json: %s "
                    "(--generation-config vllm: none)", "the model's" if setting == "auto" else setting, found)
    return found


def given(value: Any, defaults: dict[str, Any], name: str, fallback: Any) -> Any:
    """The request's value; else the model's recommendation; else OpenAI's default."""
    return value if value is not None else defaults.get(name, fallback)
