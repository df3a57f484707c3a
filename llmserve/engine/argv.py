"""The engine's settings from a command line: ``EngineConfig``'s flags and their reading.

Every entry point that starts an engine (``llmserve engine``, ``generate``, ``chat``,
``calibrate``, the instance server's own ``python -m llmserve.server``, the fidelity
harness) adds these flags and builds its ``EngineConfig`` here, so none of them needs
the console script's module. ``LLMSERVE_MODEL_STORE`` is the model store's default.
"""

from __future__ import annotations

import argparse
import os

from llmserve.engine.config import EngineConfig
from llmserve.flags import add_flags, given


def model_store_default() -> str | None:
    return os.environ.get("LLMSERVE_MODEL_STORE")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine flags, generated from ``EngineConfig`` (named as in ``vllm serve``)."""
    add_flags(p.add_argument_group("engine"), EngineConfig)


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    """The config the flags in ``args`` give (every default from the model itself)."""
    kw = given(EngineConfig, args)
    if kw.get("model_store") is None and model_store_default():
        kw["model_store"] = model_store_default()
    if getattr(args, "served_model_name", None):
        kw["served_model_name"] = args.served_model_name[0]
    return EngineConfig(**kw)
