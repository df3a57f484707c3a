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
                   help="log one line per request (off by default: it costs ~5 %% of the "
                        "gateway's CPU per proxied request; the metrics count every request)")


def run_gateway_cmd(args: argparse.Namespace) -> int:
    import logging

    from llmserve.gateway.app import run_gateway

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_gateway(args.config, host=args.host, port=args.port, log_level=args.log_level,
                access_log=args.access_log)
    return 0
