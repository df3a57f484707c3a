"""``llmserve gateway --config gateway.yaml``: flags and entry point for the CLI."""

from __future__ import annotations

import argparse


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True,
                   help="gateway YAML (see docs/gateway.example.yaml)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true",
                   help="one JSON line per proxied request on stderr: timings, attempts, trace id "
                        "(off by default; the metrics count every request)")
    p.add_argument("--otlp-endpoint", default=None,
                   help="OTLP/HTTP collector for traces, e.g. http://127.0.0.1:4318 "
                        "(default: OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing)")
    p.add_argument("--trace-sample-ratio", type=float, default=1.0,
                   help="share of new traces recorded; instances follow the gateway's decision (default 1)")


def run_gateway_cmd(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys

    from llmserve.gateway.app import run_gateway
    from llmserve.tracing.config import TracingConfig

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    refused = store_refusal(args.config)
    if refused is not None:
        print(f"llmserve: error: {refused}", file=sys.stderr)
        return 2
    tracing = TracingConfig.resolve(args.otlp_endpoint, os.environ, "llmserve-gateway", args.access_log,
                                    args.trace_sample_ratio)
    run_gateway(args.config, host=args.host, port=args.port, log_level=args.log_level, tracing=tracing)
    return 0


def store_refusal(config_path: str) -> str | None:
    """Why the configured Redis refuses this replica (a wrong password, an open URL), or
    None. Checked before serving, so the replica does not start and says so in one line;
    an unreachable store is no refusal (the gateway degrades and retries)."""
    import asyncio

    from llmserve.gateway.config import GatewayConfig

    state = GatewayConfig.load(config_path).state
    if state.redis_url is None:
        return None
    from llmserve.state.redis_conn import StoreError, StoreUnreachable, connect

    async def check() -> None:
        await (await connect(state.redis_url, state.redis_password_file)).aclose()

    try:
        asyncio.run(check())
    except StoreUnreachable:
        return None
    except StoreError as e:
        return str(e)
    return None
