"""``vllm bench serve``'s other spellings of the same settings, taken as scripts type them.

A script written for vLLM's bench says ``--backend openai-chat --endpoint
/v1/chat/completions``, ``--host H --port P``, ``--served-model-name NAME --model PATH``
and ``--save-result --result-dir DIR``. Each is folded here into the one setting it
means (:func:`fold`, before the configuration is validated); one that contradicts
another flag is a flag error, never a silent choice between them.
"""

from __future__ import annotations

import argparse
import datetime
import math
from pathlib import Path
from typing import Any

# vLLM's backends that speak OpenAI's completions API, and its chat one; others (TGI's own
# API, embeddings, audio) are not what this bench sends, so argparse refuses them.
BACKENDS = {"openai": "completions", "vllm": "completions", "sglang": "completions", "lmdeploy": "completions",
            "llama.cpp": "completions", "openai-chat": "chat"}


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("vLLM's spellings", "the same settings as vllm bench serve names them")
    s = argparse.SUPPRESS
    g.add_argument("--backend", choices=sorted(BACKENDS), default=s,
                   help="openai-chat sends chat completions, the others completions (as --endpoint)")
    g.add_argument("--host", default=s, help="with --port, the server when --base-url is not given "
                   "(default 127.0.0.1)")
    g.add_argument("--port", type=int, default=s, help="(default 8000)")
    g.add_argument("--served-model-name", default=s, metavar="NAME",
                   help="the model name sent; --model then names the tokenizer (where --tokenizer is not given)")
    g.add_argument("--result-dir", default=s, metavar="DIR", help="where --save-result writes (default: here)")
    g.add_argument("--result-filename", default=s, metavar="FILE",
                   help="the file --save-result writes (default: vLLM's LABEL-RATEqps[-concurrencyN]-MODEL-TIME.json, "
                   "LABEL being --label or the endpoint)")


def fold(args: argparse.Namespace) -> None:
    """Rewrite ``args`` so that only the bench's own flags carry these settings."""
    given = vars(args)
    if "backend" in given:
        implied = BACKENDS[given["backend"]]
        if given.setdefault("endpoint", implied) != implied:
            raise ValueError(f"--backend {given['backend']} sends {implied}, but --endpoint says {given['endpoint']}")
    if "host" in given or "port" in given:
        if "base_url" in given:
            raise ValueError("--base-url and --host/--port both name the server: give one of them")
        host = given.get("host", "127.0.0.1")
        given["base_url"] = f"http://[{host}]:{given.get('port', 8000)}" if ":" in host else \
            f"http://{host}:{given.get('port', 8000)}"
    if "served_model_name" in given:
        model = given.get("model")
        if model and "tokenizer" not in given and Path(model).exists():
            given["tokenizer"] = model  # vLLM's --model: the tokenizer's source
        given["model"] = given["served_model_name"]
    if ("result_dir" in given or "result_filename" in given) and given.get("save_result"):
        raise ValueError("--save-result FILE and --result-dir/--result-filename both name the result file: "
                         "give one of them")
    if "result_dir" in given or "result_filename" in given:
        given["save_result"] = ""  # named once the model and load are known (result_path)
    for key in ("backend", "host", "port", "served_model_name"):
        given.pop(key, None)


def result_path(args: argparse.Namespace, cfg: Any) -> str:
    """Where a bare ``--save-result`` writes: ``--result-dir`` / ``--result-filename``, or
    vLLM's default name ``LABEL-RATEqps[-concurrencyN]-MODEL-YYYYMMDD-HHMMSS.json``."""
    name = getattr(args, "result_filename", None)
    if not name:
        rate = "inf" if math.isinf(cfg.load.request_rate) else f"{cfg.load.request_rate:g}"
        conc = f"-concurrency{cfg.load.max_concurrency}" if cfg.load.max_concurrency else ""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        name = f"{cfg.label or cfg.endpoint.endpoint}-{rate}qps{conc}-{cfg.endpoint.model.split('/')[-1]}-{stamp}.json"
    return str(Path(getattr(args, "result_dir", None) or ".") / name)
