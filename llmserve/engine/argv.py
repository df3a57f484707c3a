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


_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _one_device(value: str) -> int:
    if value != "1":
        raise argparse.ArgumentTypeError(f"{value!r} is not supported: an instance runs on one device "
                                         "(--instances shares a machine between engines)")
    return 1


def _gpu_memory_utilization(value: str) -> str:
    raise argparse.ArgumentTypeError("is not supported: --kv-cache-memory sizes the KV pool (bytes, e.g. 2G)")


def add_vllm_server_aliases(p: argparse.ArgumentParser) -> None:
    """``vllm serve`` flags a copied command line carries, where llmserve does the same:
    request contents are never logged, ``--log-level`` is uvicorn's level too, one device, no CUDA graphs,
    and no model code is ever run (weights are read as data)."""
    g = p.add_argument_group("vLLM's names")
    g.add_argument("--tensor-parallel-size", "-tp", type=_one_device, default=argparse.SUPPRESS,
                   help="only 1: an instance runs on one device")
    g.add_argument("--trust-remote-code", action="store_true", default=argparse.SUPPRESS,
                   help="accepted, no effect: no model code is ever run (the known families are built in)")
    g.add_argument("--enforce-eager", action="store_true", default=argparse.SUPPRESS,
                   help="accepted: steps always run eagerly (no CUDA graphs)")
    g.add_argument("--gpu-memory-utilization", type=_gpu_memory_utilization, default=argparse.SUPPRESS,
                   help="refused: --kv-cache-memory sizes the KV pool")
    g.add_argument("--enable-auto-tool-choice", action="store_true", default=argparse.SUPPRESS,
                   help="accepted: auto tool choice is always on (tool_choice auto needs no flag here)")
    g.add_argument("--disable-log-requests", action="store_true", default=argparse.SUPPRESS,
                   help="accepted: request contents are never logged (--access-log logs timings)")
    g.add_argument("--uvicorn-log-level", dest="log_level", choices=_LOG_LEVELS, default=argparse.SUPPRESS,
                   help="the same as --log-level")
