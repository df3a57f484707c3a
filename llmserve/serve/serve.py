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
import dataclasses
import functools
import os
import logging
import secrets
import sys
from typing import Any

from llmserve.autoscale.build import static_size
from llmserve.autoscale.config import AutoscaleConfig, BoundsConfig
from llmserve.autoscale.controller import PoolController, Prober
from llmserve.autoscale.probe import EngineEndpoints
from llmserve.autoscale.providers.base import InstanceProvider
from llmserve.serve.deployment import deep_merge
from llmserve.serve.serve_config import SERVE_AUTOSCALE_DEFAULTS, ProviderSettings, ServeConfig, serve_file
from llmserve.state.gateway_state import check_store
from llmserve.flags import add_flags, given
from llmserve.tracing.config import ENV_ENDPOINT, TracingConfig

log = logging.getLogger(__name__)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Flags generated from the serve file's fields (``llmserve/flags.py``); a flag wins over the file."""
    p.add_argument("--config", default=None, help="serve YAML (see docs/serve.example.yaml); flags override it")
    p.add_argument("--otlp-endpoint", default=None,
                   help="OTLP/HTTP collector for the gateway's and every instance's traces "
                        "(default: OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing)")
    p.add_argument("--trace-sample-ratio", type=float, default=1.0,
                   help="share of new traces recorded; instances follow the gateway's decision (default 1)")
    p.add_argument("--access-log", action="store_true", help="one JSON line per request on stderr")
    p.add_argument("--replica", type=int, default=None, help=argparse.SUPPRESS)  # set by --replicas
    add_flags(p, ServeConfig)
    add_flags(p.add_argument_group("provider"), ProviderSettings)
    g = p.add_argument_group("autoscale (the file's autoscale section)")
    add_flags(g, AutoscaleConfig)
    add_flags(g, BoundsConfig, defaults=SERVE_AUTOSCALE_DEFAULTS["bounds"])


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, as a nested dict shaped like the YAML."""
    o = given(ServeConfig, args)
    auto: dict[str, Any] = given(AutoscaleConfig, args)
    bounds = given(BoundsConfig, args)
    if bounds:
        auto["bounds"] = bounds
    if auto.get("policy") == "static" and "min_instances" in bounds:
        auto["static"] = {"instances": bounds["min_instances"]}
    if auto:
        o["autoscale"] = auto
    provider = given(ProviderSettings, args)
    if provider:
        o["provider"] = provider
    return o


def build_provider(cfg: ServeConfig) -> InstanceProvider:
    p = cfg.provider
    if p.kind == "ray":
        from llmserve.autoscale.providers.ray import RayProvider, RayProviderConfig

        ray_provider = RayProvider(RayProviderConfig(
            address=p.ray_address, num_cpus=p.ray_num_cpus, num_gpus=p.ray_num_gpus, bind_host=p.ray_bind_host,
            log_dir=p.log_dir, local_num_cpus=p.ray_local_num_cpus,
            detached=cfg.gateway.state.redis_url is not None))  # replicas: actors outlive their leader
        ray_provider.connect()
        return ray_provider
    from llmserve.autoscale.providers.local import LocalProvider, LocalProviderConfig
    from llmserve.serve.leases import registry_dir

    state = cfg.gateway.state  # replicas: instances outlive the one that started them, listed on disk
    return LocalProvider(LocalProviderConfig(log_dir=p.log_dir, fork_from_template=p.fork_from_template,
                                             registry_dir=registry_dir(state.dir) if state.redis_url else None))


def build_app(cfg: ServeConfig, provider: InstanceProvider, admin_key: str, prober: Prober | None = None):
    """The gateway app with its first controlled pool; returns ``(app, controller)``
    (every pool's controller is in ``app.state.controllers``)."""
    app, controllers = build_deployment(cfg, provider, admin_key, prober)
    return app, controllers[0]


def build_deployment(cfg: ServeConfig, provider: InstanceProvider, admin_key: str, prober: Prober | None = None,
                     tracing: TracingConfig | None = None):
    """The gateway app with one controller per pool (every version of every model),
    all sharing ``provider``; returns ``(app, controllers)``. ``prober`` replaces the
    HTTP prober (tests with a fake provider)."""
    from llmserve.serve.admin import autoscale_router
    from llmserve.autoscale.metrics import AutoscaleMetrics
    from llmserve.gateway.admin import admin_guard
    from llmserve.gateway.app import create_app

    pools = cfg.pools()
    keys = {p.key: cfg.instance_key() for p in pools}  # one key per pool
    app = create_app(cfg.gateway_config(admin_key, keys), gateway_telemetry(tracing))
    gw = app.state.gateway
    gw.ready_at_zero, gw.controlled = rests_at_zero(cfg), True
    metrics = AutoscaleMetrics(gw.metrics.registry)
    single = len(pools) == 1
    controllers = []
    leases = None
    if cfg.gateway.state.redis_url:  # replicas: one lease per pool (serve/leases.py)
        from llmserve.autoscale.leadership import LeaderController
        from llmserve.serve.leases import PoolLeases, canary_gate, check_replicas

        check_replicas(cfg.provider.kind, cfg.provider.ray_address, cfg.instance_api_key)
        leases = PoolLeases(cfg.gateway.state.redis_url, cfg.gateway.state.redis_password_file, cfg.leases)
    from llmserve.autoscale.core_share import cap_to_cores
    from llmserve.engine.threads import available_cores

    for i, p in enumerate(pools):
        key = keys[p.key]
        auto = cap_to_cores(cfg.autoscale_config(p), available_cores()) if cfg.shares_cores(p) else \
            cfg.autoscale_config(p)
        # Instance ids name their pool: the version alone while there is one model.
        prefix = f"{p.version}-" if len({q.model for q in pools}) == 1 else f"{safe_id(p.model)}-{p.version}-"
        kind, lead = (PoolController, {"provider": provider}) if leases is None else \
            (LeaderController, leases.controller_args(provider, p.key))
        controller = kind(gw.pool(p.model, p.version), p.model, p.version, auto,
                          spec_factory=traced_specs(functools.partial(cfg.instance_spec, instance_key=key, pool=p),
                                                    tracing),
                          config=cfg.controller_config(), metrics=metrics, prober=prober,
                          instance_api_key=key, id_prefix=None if single else prefix,
                          close_provider=i == 0,  # the gateway stops the first pool last
                          endpoints=EngineEndpoints(p.ready_path, p.load_source),
                          adapter_versions=p.adapter_versions, **lead)
        gw.services.append(controller)
        gw.observers.append(controller)
        controllers.append(controller)
    if cfg.provider.kind == "local":  # instances on this machine share its cores
        from llmserve.autoscale.core_share import CoreShare, SharedPool

        gw.services.append(CoreShare([SharedPool(c, cfg.shares_cores(p), keys[p.key])
                                      for c, p in zip(controllers, pools)], available_cores()))
    if leases is not None:  # each canary decision once, by the leader of the pool that decides it
        canaries = {m.name: m.canary.version for m in gw.config.models if m.canary is not None}
        gw.decides = canary_gate(leases, canaries, [p.key for p in pools])
    app.include_router(autoscale_router(controllers, admin_guard(gw)))
    app.state.controller = controllers[0]
    app.state.controllers = controllers
    return app, controllers


def rests_at_zero(cfg: ServeConfig) -> bool:
    """Every pool may have no instance by design (a floor of 0): scaled to zero, it starts one
    for the first request, which waits in the queue."""
    def floor(auto: AutoscaleConfig) -> int:
        if auto.policy == "static":
            return static_size(auto)
        return max(auto.bounds.min_instances, auto.capacity.on_demand.min_instances or 0)

    return all(floor(cfg.autoscale_config(p)) == 0 for p in cfg.pools())


def gateway_telemetry(tracing: TracingConfig | None):
    if tracing is None or not (tracing.enabled or tracing.access_log):
        return None
    from llmserve.tracing.start import start_tracing
    from llmserve.tracing.gateway import GatewayTelemetry

    return GatewayTelemetry(start_tracing(tracing), tracing.access_log)


def traced_specs(specs, tracing: TracingConfig | None):
    """Instance specs whose engines trace to the same collector (OpenTelemetry's own variable,
    which ``llmserve engine`` reads once at start) and log the same way."""
    if tracing is None or not (tracing.enabled or tracing.access_log):
        return specs

    def spec(instance_id: str):
        s = specs(instance_id)
        env = s.env + ((ENV_ENDPOINT, tracing.otlp_endpoint),) if tracing.enabled else s.env
        args = s.engine_args + ("--access-log",) if tracing.access_log and not s.command else s.engine_args
        return dataclasses.replace(s, env=env, engine_args=args)
    return spec


def safe_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def run_serve(args: argparse.Namespace) -> int:
    cfg = ServeConfig.load(args.config, overrides_from_args(args))
    if args.replica is not None:  # one of a --replicas set: each runs the controllers, the pool's
        # lease holder leads and publishes the pool (autoscale/leadership.py); "follow": none may
        role = "follow" if cfg.gateway.state.pools == "follow" else "own"
        cfg = ServeConfig.load(args.config, deep_merge(overrides_from_args(args),
                                                       {"gateway": {"state": {"pools": role}}}))
    if cfg.provider.kind == "local":  # (on Ray the models are the nodes.)
        from llmserve.models.store import resolve

        for p in cfg.pools():  # a missing or unpulled model: one line, exit 2 now (not instances failing)
            if not p.command:
                resolve(p.source, cfg.model_store)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))  # one line per poll
    tracing_argv = [*(["--otlp-endpoint", args.otlp_endpoint] if args.otlp_endpoint else []),
                    "--trace-sample-ratio", str(args.trace_sample_ratio), *(["--access-log"] if args.access_log else [])]
    if cfg.replicas > 1:
        from llmserve.serve.replicas import run_replicas

        return run_replicas(cfg, serve_file(args.config, overrides_from_args(args)), tracing_argv)
    from llmserve.gateway.app import bound_socket

    sock = bound_socket(cfg.host, cfg.port, reuse_port=args.replica is not None)  # before any instance starts
    admin_key = cfg.admin_key or secrets.token_urlsafe(24)
    tracing = TracingConfig.resolve(args.otlp_endpoint, os.environ, "llmserve-gateway", args.access_log,
                                    args.trace_sample_ratio)
    if cfg.gateway.state.pools == "follow":
        return serve_app(cfg, follower_app(cfg, admin_key, tracing), sock)
    provider = build_provider(cfg)
    app, controllers = build_deployment(cfg, provider, admin_key, tracing=tracing)
    base = f"http://{cfg.host}:{cfg.port}"
    shown_key = f"#key={admin_key}" if cfg.admin_key is None else ""
    lines = []
    for c, p in zip(controllers, cfg.pools()):
        auto = c.autoscale
        size = f"{static_size(auto)}" if auto.policy == "static" else \
            f"{auto.bounds.min_instances}-{auto.bounds.max_instances}"
        threads = "the cores shared out over the instances running" if cfg.shares_cores(p) else \
            f"{cfg.threads(p)} threads each"
        lines.append(f"  pool {p.key} ({p.source}, weight {p.weight:g}): policy {auto.policy}, {size} instances, "
                     f"{threads}\n")
        lines += [f"    with version {v}: a LoRA adapter on this pool\n" for v in p.adapter_versions]
    print(f"llmserve serve: {', '.join(sorted({p.model for p in cfg.pools()}))} on {base}/v1 "
          f"({provider.name} provider)\n{''.join(lines)}"
          f"  dashboard {base}/dashboard{shown_key}\n"
          f"  admin API {base}/admin/autoscale/pools (Authorization: Bearer <admin key>)", flush=True)
    return serve_app(cfg, app, sock)


def follower_app(cfg: ServeConfig, admin_key: str, tracing: TracingConfig | None):
    """A replica without the controller: its pools mirror replica 0's (state.pools: follow)."""
    from llmserve.gateway.app import create_app

    keys = {p.key: cfg.instance_key() for p in cfg.pools()}  # Ray's is the one --replicas wrote
    app = create_app(cfg.gateway_config(admin_key, keys), gateway_telemetry(tracing))
    app.state.gateway.decides = lambda model: False  # canary decisions are the pools' leaders'
    app.state.gateway.ready_at_zero, app.state.gateway.controlled = rests_at_zero(cfg), True
    return app


def serve_app(cfg: ServeConfig, app, sock) -> int:
    """uvicorn on the bound port (a replica's bound with SO_REUSEPORT, beside its siblings)."""
    import uvicorn

    from llmserve.http_guard import uvicorn_options

    gcfg = app.state.gateway.config
    options = dict(host=cfg.host, port=cfg.port, log_level="warning" if cfg.log_level == "info" else cfg.log_level,
                   **uvicorn_options(gcfg.limits.http_limits()), timeout_graceful_shutdown=30)
    check_store(gcfg.state.redis_url, gcfg.state.redis_password_file)  # one line, not a traceback
    uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=[sock])
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="llmserve serve")
    add_serve_args(parser)
    sys.exit(run_serve(parser.parse_args()))
