"""The instance server's own entry point: ``python -m llmserve.server [flags]`` runs :func:`main`.

What ``llmserve engine`` runs, without the console script: the engine's flags
(``engine/argv.py``) and the server's (``ServerConfig``). The process provider and
the template's children start instances with it. ``LLMSERVE_API_KEY`` (or vLLM's
``VLLM_API_KEY``) is one more accepted key (an environment variable is not in ``ps`` output); ``LLMSERVE_NO_KERNELS``
runs without the C++ kernels; ``LLMSERVE_NO_VNNI`` keeps the int8 kernel on its AVX2 path
on a CPU with AVX-512 VNNI (``models/kernels.py``); ``OTEL_EXPORTER_OTLP_ENDPOINT`` is the
default of ``--otlp-endpoint``.
"""

from __future__ import annotations

import argparse
import os
import sys

API_KEY_ENV = ("LLMSERVE_API_KEY", "VLLM_API_KEY")  # each one more accepted key


def add_server_args(p: argparse.ArgumentParser) -> None:
    from llmserve.flags import add_flags
    from llmserve.server.config import ServerConfig

    add_flags(p.add_argument_group("server"), ServerConfig)


def serve(args: argparse.Namespace) -> int:
    """Serve one engine instance over HTTP with the flags parsed into ``args``."""
    # numpy's OpenBLAS pool would start a thread at import; the engine process is forked
    # from this one, which must then have one thread (torch does the arithmetic).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from llmserve.engine.argv import engine_config_from
    from llmserve.flags import given
    from llmserve.server.app import run_server
    from llmserve.server.config import ServerConfig

    server = given(ServerConfig, args)
    env_keys = [k for name in API_KEY_ENV if (k := os.environ.get(name)) and k not in server.get("api_keys", [])]
    server["api_keys"] = server.get("api_keys", []) + list(dict.fromkeys(env_keys))
    server.setdefault("otlp_endpoint", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)
    ecfg = engine_config_from(args)
    if not server.get("served_model_name"):  # the name it was asked for, as `llmserve serve` does
        from llmserve.models.store import served_name

        server["served_model_name"] = [served_name(ecfg.model)]
    scfg = ServerConfig(**server)
    if ecfg.threads is None:  # its share of this machine's cores
        from llmserve.engine.threads import available_cores, engine_threads

        ecfg = ecfg.model_copy(update={"threads": engine_threads(available_cores(), ecfg.instances)})
    # The port is bound before the imports and the model load (seconds): a port picked free
    # for this instance is its own at once. Connections wait in the backlog until uvicorn runs;
    # a process forked from here (the engine) closes its copy.
    from llmserve.ports import listen

    try:
        sock = listen(scfg.host, scfg.port)
    except OSError as e:  # one line, exit 2 (run_command), as for a bad flag
        raise ValueError(f"cannot listen on {scfg.host}:{scfg.port}: {(e.strerror or str(e)).lower()}") from None
    os.register_at_fork(after_in_child=sock.close)
    return run_server(ecfg, scfg, sock)


def parser() -> argparse.ArgumentParser:
    from llmserve.engine.argv import add_engine_args

    p = argparse.ArgumentParser(prog="python -m llmserve.server",
                                description="serve one engine instance over HTTP (OpenAI API)")
    add_engine_args(p)
    add_server_args(p)
    return p


def run_command(fn, args: argparse.Namespace) -> int:
    """Run a parsed command the way every llmserve entry point does: ``LLMSERVE_NO_KERNELS``
    honoured, Ctrl-C as 130, a bad model or value as one line and exit code 2."""
    if os.environ.get("LLMSERVE_NO_KERNELS"):
        from llmserve.models import kernels

        kernels.disable()
    try:
        return int(fn(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a clear one-line error for the user
        from llmserve.models.loader import ModelLoadError

        if isinstance(e, (ModelLoadError, ValueError, FileNotFoundError)):
            print(f"llmserve: error: {_one_line(e)}", file=sys.stderr)
            return 2
        raise


def _one_line(e: Exception) -> str:
    """A config's refusal named by its flag (``--chat-template: ...``), not pydantic's text."""
    from pydantic import ValidationError

    if not isinstance(e, ValidationError):
        return str(e)
    from llmserve.engine.config import EngineConfig
    from llmserve.flags import flag_error
    from llmserve.server.config import ServerConfig

    return flag_error(e, EngineConfig, ServerConfig)


def main(argv: list[str] | None = None) -> int:
    return run_command(serve, parser().parse_args(argv))
