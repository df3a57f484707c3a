"""``llmserve serve``: the gateway, the elastic controller and its instances, in one command.

The gateway answers the OpenAI API on ``--port`` (default 8000) from a pool that
starts empty; the controller starts the minimum number of ``llmserve engine``
instances (local subprocesses, or Ray actors with ``--provider ray``), adds each
to the pool once it is ready, and scales with the configured policy. The admin
API and the live dashboard (``/dashboard``) come with it. On SIGTERM or Ctrl-C
the gateway stops taking requests, finishes those in flight, and the controller
drains and stops every instance.
"""

from __future__ import annotations

import argparse
import functools
import logging
import secrets
import shlex
import sys
from typing import Any

from llmserve.autoscale.controller import PoolController, Prober
from llmserve.autoscale.providers.base import InstanceProvider
from llmserve.autoscale.serve_config import ServeConfig

log = logging.getLogger(__name__)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="serve YAML (see docs/serve.example.yaml); flags override it")
    p.add_argument("--host", default=None, help="gateway address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="gateway port (default 8000)")
    p.add_argument("--model", default=None, help="model store name, .gguf file or HF folder "
                                                 "(default SmolLM2-135M-Instruct)")
    p.add_argument("--model-store", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--min-instances", type=int, default=None)
    p.add_argument("--max-instances", type=int, default=None)
    p.add_argument("--policy", default=None, choices=["predictive", "threshold", "kpa", "static"])
    p.add_argument("--tick", type=float, default=None, help="seconds between scaling decisions")
    p.add_argument("--cold-start-delay", type=float, default=None,
                   help="testing: each instance waits this long before loading (a slow cold start)")
    p.add_argument("--threads-per-instance", type=int, default=None,
                   help="torch CPU threads per instance (default: CPUs / max instances)")
    p.add_argument("--engine-args", default=None,
                   help='flags for every instance, one string: --engine-args "--max-num-seqs 16"')
    p.add_argument("--provider", default=None, choices=["local", "ray"])
    p.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local runtime)")
    p.add_argument("--admin-key", default=None, help="admin API and dashboard key (default: random, printed)")
    p.add_argument("--log-dir", default=None, help="instances' logs (default: a temporary folder)")
    p.add_argument("--log-level", default=None, choices=["critical", "error", "warning", "info", "debug"])


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, as a nested dict shaped like the YAML."""
    o: dict[str, Any] = {}
    for flag in ("host", "port", "model", "model_store", "served_model_name", "admin_key", "log_level",
                 "threads_per_instance"):
        v = getattr(args, flag, None)
        if v is not None:
            o[flag] = v
    if args.cold_start_delay is not None:
        o["cold_start_delay_s"] = args.cold_start_delay
    if args.engine_args is not None:
        o["engine_args"] = shlex.split(args.engine_args)
    auto: dict[str, Any] = {}
    bounds = {k: v for k, v in (("min_instances", args.min_instances), ("max_instances", args.max_instances))
              if v is not None}
    if bounds:
        auto["bounds"] = bounds
    if args.policy is not None:
        auto["policy"] = args.policy
        if args.policy == "static" and args.min_instances is not None:
            auto["static"] = {"instances": args.min_instances}
    if args.tick is not None:
        auto["tick_s"] = args.tick
    if auto:
        o["autoscale"] = auto
    provider = {k: v for k, v in (("kind", args.provider), ("ray_address", args.ray_address),
                                  ("log_dir", args.log_dir)) if v is not None}
    if provider:
        o["provider"] = provider
    return o


def build_provider(cfg: ServeConfig) -> InstanceProvider:
    p = cfg.provider
    if p.kind == "ray":
        from llmserve.autoscale.providers.ray import RayProvider, RayProviderConfig

        ray_provider = RayProvider(RayProviderConfig(
            address=p.ray_address, num_cpus=p.ray_num_cpus, num_gpus=p.ray_num_gpus, bind_host=p.ray_bind_host,
            log_dir=p.log_dir, local_num_cpus=p.ray_local_num_cpus))
        ray_provider.connect()
        return ray_provider
    from llmserve.autoscale.providers.local import LocalProvider, LocalProviderConfig

    return LocalProvider(LocalProviderConfig(log_dir=p.log_dir, fork_from_template=p.fork_from_template))


def build_app(cfg: ServeConfig, provider: InstanceProvider, admin_key: str, prober: Prober | None = None):
    """The gateway app with one controlled pool; returns ``(app, controller)``.
    ``prober`` replaces the HTTP prober (tests with a fake provider)."""
    from llmserve.autoscale.admin import autoscale_router
    from llmserve.autoscale.metrics import AutoscaleMetrics
    from llmserve.gateway.admin import admin_guard
    from llmserve.gateway.app import create_app

    key = cfg.instance_key()
    app = create_app(cfg.gateway_config(admin_key, key))
    gw = app.state.gateway
    name = cfg.served_name
    controller = PoolController(gw.pool(name, cfg.version), name, cfg.version, cfg.autoscale_config(), provider,
                                functools.partial(cfg.instance_spec, instance_key=key), cfg.controller_config(),
                                metrics=AutoscaleMetrics(gw.metrics.registry), prober=prober,
                                instance_api_key=key)
    gw.services.append(controller)
    gw.observers.append(controller)
    app.include_router(autoscale_router([controller], admin_guard(gw)))
    app.state.controller = controller
    return app, controller


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    cfg = ServeConfig.load(args.config, overrides_from_args(args))
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))  # one line per poll
    admin_key = cfg.admin_key or secrets.token_urlsafe(24)
    provider = build_provider(cfg)
    app, controller = build_app(cfg, provider, admin_key)
    auto = controller.autoscale
    base = f"http://{cfg.host}:{cfg.port}"
    shown_key = f"#key={admin_key}" if cfg.admin_key is None else ""
    print(f"llmserve serve: model {cfg.served_name} ({cfg.model}) on {base}/v1\n"
          f"  policy {auto.policy}, {auto.bounds.min_instances}-{auto.bounds.max_instances} instances "
          f"({provider.name} provider, {cfg.threads()} threads each)\n"
          f"  dashboard {base}/dashboard{shown_key}\n"
          f"  admin API {base}/admin/autoscale/pools (Authorization: Bearer <admin key>)", flush=True)
    from llmserve.http_guard import uvicorn_options

    gcfg = app.state.gateway.config
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning" if cfg.log_level == "info" else cfg.log_level,
                **uvicorn_options(gcfg.limits.http_limits()), timeout_graceful_shutdown=30)
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="llmserve serve")
    add_serve_args(parser)
    sys.exit(run_serve(parser.parse_args()))
