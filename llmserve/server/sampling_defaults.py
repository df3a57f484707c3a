"""The sampling defaults an instance gives what a request leaves out (``--generation-config``,
vLLM's flag and meaning): ``auto`` (default) the model's generation_config.json
recommendations (``models/generation_defaults.py``), ``vllm`` none (OpenAI's defaults), or
the generation_config.json in a given folder. A field the request gives always wins."""

from __future__ import annotations

import dataclasses
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


def default_max_tokens(defaults: dict[str, Any], chat: bool, limit: int | None) -> int | None:
    """A request without one: the model's recommendation, a cap (no more than ``limit`` either,
    and see ``room_capped``); else chat's "to the context's end", completions' 16 (OpenAI's)."""
    if "max_tokens" in defaults:
        return min(defaults["max_tokens"], limit) if limit else defaults["max_tokens"]
    return None if chat else 16


def room_capped(sp: Any, defaults: dict[str, Any], r: Any, prompts: list[list[int]], max_model_len: int) -> Any:
    """The model's default ``max_tokens`` is a cap, as vLLM's (the smaller of it and the room
    the context leaves, the longest prompt's where there are several): a request that asked
    for no length is never refused for the model's recommendation. One it asked for is kept."""
    asked = r.max_tokens is not None or getattr(r, "max_completion_tokens", None) is not None
    if asked or "max_tokens" not in defaults or sp.max_tokens is None:
        return sp
    room = max_model_len - max(len(p) for p in prompts)
    return dataclasses.replace(sp, max_tokens=min(sp.max_tokens, room)) if 0 < room < sp.max_tokens else sp
