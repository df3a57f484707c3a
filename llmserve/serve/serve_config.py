"""``llmserve serve``'s configuration: one YAML file, overridable by flags, validated once.

Everything a served deployment needs is here: the model and the engine flags its
instances get, the provider, the scaling policy (``autoscale``, the very
:class:`~llmserve.autoscale.config.AutoscaleConfig` the simulator takes), the
instance lifecycle timing (``lifecycle``) and the gateway's own settings
(``gateway``: auth, limits, polling, retries...; ``pool``: admission,
concurrency, balancer). See ``docs/serve.example.yaml``.

``models:`` (see :mod:`llmserve.serve.deployment` and ``docs/deployments.md``)
serves several models and versions, each version its own elastic pool; without it
the single-model keys are a one-version deployment. Both become the same list of
:class:`~llmserve.serve.deployment.PoolDeployment` (:meth:`ServeConfig.pools`).
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmserve.autoscale.config import AutoscaleConfig
from llmserve.serve.deployment import (ModelDeployment, PoolDeployment, check_engine_args, deep_merge,
                                           pools_of, served_name_of)
from llmserve.autoscale.managed import ControllerConfig
from llmserve.autoscale.providers.base import InstanceSpec
from llmserve.flags import Flag
from llmserve.state.lease import LeaseConfig
from llmserve.gateway.config import AuthConfig, GatewayConfig, GatewaySettings, PoolSettings, yaml_mapping

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
# Single-model keys that ``models:`` replaces (a version says its own).
SINGLE_MODEL_KEYS = ("model", "served_model_name", "version", "price_per_1k_prompt_tokens",
                     "price_per_1k_completion_tokens")

# Defaults for instances on one CPU machine; anything in the file or flags wins.
# Cold start of the default model on CPU is seconds, so look ahead 30 s, not minutes.
SERVE_AUTOSCALE_DEFAULTS: dict[str, Any] = {
    "bounds": {"min_instances": 1, "max_instances": 4, "scale_up_cooldown_s": 10.0,
               "scale_down_window_s": 120.0},
    "predictive": {"lead_time_s": 30.0, "capacity_tokens_per_s": 300.0},
}


def _fields(m: BaseModel) -> dict[str, Any]:
    """A model's fields, values as they are (validating them again leaves them so)."""
    return {k: getattr(m, k) for k in type(m).model_fields}


def _models_over_pool(models: list[Any], top: Any) -> list[Any]:
    """Each model's ``pool`` keys deep-merged over the file's top-level ``pool`` (as
    validated: a mapping it sets replaces the default one, as in the gateway's file).
    A top-level pool that does not validate is left for its own error."""
    try:
        base = (top if isinstance(top, PoolSettings) else PoolSettings.model_validate(top or {})).model_dump()
    except ValueError:
        return models
    return [{**m, "pool": deep_merge(base, m.get("pool") or {})}
            if isinstance(m, dict) and isinstance(m.get("pool", {}), dict) else m for m in models]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderSettings(_Strict):
    """Where instances run. ``ray_*`` apply to ``kind: ray`` only."""

    kind: Annotated[Literal["local", "ray"], Flag(name="--provider")] = Field("local",
                                                                           description="where instances run")
    log_dir: str | None = Field(None, description="instances' logs (default: a temporary folder)")
    fork_from_template: bool = Field(True, description="local: fork instances from a pre-imported template process")
    ray_address: str | None = Field(None, description="an existing Ray cluster (default: a local runtime)")
    ray_num_cpus: float = Field(1.0, ge=0.0, description="ray: CPUs per instance")
    ray_num_gpus: float = Field(0.0, ge=0.0, description="ray: GPUs per instance, on GPU clusters")
    ray_bind_host: str | None = Field(None, description="ray: the address engines listen on "
                                                        "(default: loopback on a local runtime, else each node's)")
    ray_local_num_cpus: int | None = Field(None, ge=1, description="ray: a local runtime's CPUs (default: all)")


class ServeConfig(_Strict):
    host: str = Field("127.0.0.1", description="gateway address")
    port: int = Field(8000, ge=1, le=65535, description="gateway port")
    model: str = Field(DEFAULT_MODEL, description="model store name, .gguf file or HF folder")
    model_store: str | None = Field(None, description="model store folder")
    served_model_name: str | None = Field(None, description="the name clients ask for (default: the model's)")
    version: Annotated[str, Flag(skip=True)] = "v1"
    engine_args: Annotated[list[str], Flag(type=str, parse=shlex.split)] = Field(
        default_factory=list, description='flags for every instance, one string: --engine-args "--max-num-seqs 16"')
    threads_per_instance: int | None = Field(
        None, ge=1, description="torch CPU threads per instance (default: the CPUs shared out over the "
                                "instances running, as they come and go)")
    cold_start_delay_s: float = Field(
        0.0, ge=0.0, description="testing: each instance waits this long before loading (a slow cold start)")
    # What a key's money budget is charged (docs/keys.md; with models, each model's own)
    price_per_1k_prompt_tokens: Annotated[float, Flag(skip=True)] = Field(0.0, ge=0.0)
    price_per_1k_completion_tokens: Annotated[float, Flag(skip=True)] = Field(0.0, ge=0.0)
    admin_key: str | None = Field(None, min_length=16,
                                  description="admin API and dashboard key (default: random, printed)")
    # The key instances require (the gateway and the controller's probes send it).
    # None: a random one per pool with the ray provider, none for local subprocesses.
    # Not a flag: argv is visible to every local user.
    instance_api_key: Annotated[str | None, Flag(skip=True)] = Field(None, min_length=8)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field("info", description="serve's log level")
    replicas: int = Field(1, ge=1, le=64, description="gateway processes on the port (SO_REUSEPORT), sharing "
                                                    "state through Redis (their own, unless gateway.state.redis_url)")
    provider: ProviderSettings = ProviderSettings()
    # The file's autoscale, over SERVE_AUTOSCALE_DEFAULTS (see _serve_defaults).
    autoscale: AutoscaleConfig = AutoscaleConfig.model_validate(SERVE_AUTOSCALE_DEFAULTS)
    lifecycle: ControllerConfig = ControllerConfig()
    leases: LeaseConfig = LeaseConfig()  # one writer per pool, with gateway.state.redis_url (docs/leases.md)
    gateway: GatewaySettings = GatewaySettings()
    pool: PoolSettings = PoolSettings()  # admission, concurrency, balancer
    # Several models and versions, one pool each; engine_args, autoscale,
    # threads_per_instance and cold_start_delay_s above are then every pool's defaults.
    models: Annotated[list[ModelDeployment] | None, Flag(skip=True)] = Field(None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _serve_defaults(cls, d: Any) -> Any:
        if isinstance(d, dict) and isinstance(d.get("autoscale", {}), dict):
            d = {**d, "autoscale": deep_merge(SERVE_AUTOSCALE_DEFAULTS, d.get("autoscale", {}))}
        if isinstance(d, dict) and isinstance(d.get("models"), list):
            d = {**d, "models": _models_over_pool(d["models"], d.get("pool"))}
        return _admin_key_once(d)

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, args: list[str]) -> list[str]:
        return check_engine_args(args)

    @field_validator("gateway", mode="before")
    @classmethod
    def _gateway(cls, d: Any) -> Any:
        if isinstance(d, dict) and "models" in d:
            raise ValueError("gateway: models are set by serve (models, or model, version and pool)")
        return d

    @model_validator(mode="after")
    def _check(self) -> ServeConfig:
        if self.models is not None:
            given = [k for k in SINGLE_MODEL_KEYS if k in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: with models, each version names its own model "
                                 "(models[].versions[].model)")
            served = [m.name for m in self.models]
            if len(set(served)) != len(served):
                raise ValueError(f"models: names must be unique, got {served}")
        if "dir" not in self.gateway.state.model_fields_set:  # (frozen: set once, here)
            object.__setattr__(self, "gateway", self.gateway.model_copy(
                update={"state": self.gateway.state.for_port(self.port)}))
        # Merge the versions' autoscale and build the gateway's config once now, so every
        # mistake shows at start.
        self.gateway_config("x" * 16)
        return self

    # ---- the typed pieces -------------------------------------------------------------------
    @property
    def served_name(self) -> str:
        return self.served_model_name or served_name_of(self.model)

    def pools(self) -> list[PoolDeployment]:
        """Every elastic pool this file asks for, in file order."""
        if self.models is None:
            return [PoolDeployment(self.served_name, self.version, self.model, 1.0, tuple(self.engine_args),
                                   self.autoscale, self.threads_per_instance, self.cold_start_delay_s)]
        return pools_of(self.models, self.autoscale, tuple(self.engine_args), self.threads_per_instance,
                        self.cold_start_delay_s)

    def autoscale_config(self, pool: PoolDeployment | None = None) -> AutoscaleConfig:
        return (pool or self.pools()[0]).autoscale

    def controller_config(self) -> ControllerConfig:
        return self.lifecycle

    def instance_key(self, generate: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> str | None:
        """The API key of this pool's instances: the configured one; else a fresh one
        for Ray, whose engines may listen on a node's network address; else none
        (local subprocesses listen on loopback). Call once per pool."""
        if self.instance_api_key is not None:
            return self.instance_api_key
        return generate() if self.provider.kind == "ray" else None

    def gateway_config(self, admin_key: str, instance_key: str | None | dict[str, str | None] = None
                       ) -> GatewayConfig:
        """``instance_key``: one key for every pool, or a dict by pool key (``model/version``)."""
        auth = AuthConfig.model_validate({**_fields(self.gateway.auth), "admin_key": admin_key})

        def version(p: PoolDeployment) -> dict[str, Any]:
            key = instance_key.get(p.key) if isinstance(instance_key, dict) else instance_key
            return {"name": p.version, "weight": p.weight, "upstreams": [], "api_key": key,
                    "upstream_model": p.upstream_model}

        pools = self.pools()
        if self.models is None:
            models = [{"name": self.served_name, "versions": [version(pools[0])], **_fields(self.pool),
                       **_prices(self)}]
        else:
            models = [{"name": m.name, "versions": [version(p) for p in pools if p.model == m.name] +
                       [{"name": v.name, "weight": m.weight(v), "pool": v.pool, "adapter": v.adapter}
                        for v in m.versions if v.adapter is not None],
                       "stickiness_window_s": m.stickiness_window_s, "aliases": m.aliases,
                       **({"canary": m.canary} if m.canary else {}),
                       **_fields(m.pool), **_prices(m)} for m in self.models]
        return GatewayConfig.model_validate({**_fields(self.gateway), "models": models, "auth": auth})

    def threads(self, pool: PoolDeployment | None = None) -> int:
        """Torch threads an instance starts with: the pool's own setting, else the
        machine's cores, which :mod:`llmserve.autoscale.core_share` then shares out over
        the instances running (:meth:`shares_cores`)."""
        own = (pool or self.pools()[0]).threads_per_instance
        if own is not None:
            return own
        from llmserve.engine.threads import available_cores

        return available_cores()

    def shares_cores(self, pool: PoolDeployment) -> bool:
        """Whether this pool's instances are told their share of the cores as the running set changes:
        local llmserve engines without a thread count of their own."""
        return self.provider.kind == "local" and pool.threads_per_instance is None and not pool.command

    def most_instances(self) -> int:
        """Instances every pool may run at once on this machine: what cores and the KV pools' memory are shared over."""
        return max(1, sum(self.autoscale_config(p).bounds.max_instances for p in self.pools()))

    def instance_spec(self, instance_id: str, instance_key: str | None = None,
                      pool: PoolDeployment | None = None) -> InstanceSpec:
        pool = pool or self.pools()[0]
        from llmserve.server.entry import API_KEY_ENV

        # vLLM's name too: a foreign vLLM takes the pool's key from it, and a key the user
        # exported for something else never reaches an instance (it would refuse the gateway).
        env = tuple((name, instance_key or "") for name in API_KEY_ENV)
        if pool.command:
            return InstanceSpec(instance_id, command=pool.command, env=env)
        args = ["--model", pool.source, "--served-model-name", pool.model, "--threads", str(self.threads(pool)),
                "--instances", str(self.most_instances())]
        if self.model_store:
            args += ["--model-store", self.model_store]
        if pool.cold_start_delay_s:
            args += ["--startup-delay", str(pool.cold_start_delay_s)]
        if "--priority-range" not in pool.engine_args:
            args += self._priority_range()
        # The key in the environment, not argv (which any local user can read in ps);
        # set even when empty, so a key in serve's own environment is not inherited.
        return InstanceSpec(instance_id, tuple(args + list(pool.engine_args)), env=env)

    def _priority_range(self) -> list[str]:
        """The instances' --priority-range: what the gateway's keys may send on (an integer
        priority a key is granted must not be refused by the instance), over 0 1."""
        auth = self.gateway.auth
        ranges = [p.priority_range for p in (*auth.keys, auth.open_privileges) if p.priority_range is not None]
        if not ranges:
            return []
        return ["--priority-range", str(min(0, *(lo for lo, _ in ranges))), str(max(1, *(hi for _, hi in ranges)))]

    @classmethod
    def load(cls, path: str | Path | None, overrides: dict[str, Any] | None = None) -> ServeConfig:
        return cls.model_validate(serve_file(path, overrides))


def _prices(c: ServeConfig | ModelDeployment) -> dict[str, float]:
    return {"price_per_1k_prompt_tokens": c.price_per_1k_prompt_tokens,
            "price_per_1k_completion_tokens": c.price_per_1k_completion_tokens}


def _admin_key_once(d: Any) -> Any:
    """gateway.auth.admin_key, where a gateway file has it, is serve's admin_key (one key)."""
    auth = (d.get("gateway") or {}).get("auth") if isinstance(d, dict) and isinstance(d.get("gateway"), dict) else None
    if not isinstance(auth, dict) or auth.get("admin_key") is None:
        return d
    if d.get("admin_key") not in (None, auth["admin_key"]):
        raise ValueError("admin_key and gateway.auth.admin_key differ: give one")
    gateway = {**d["gateway"], "auth": {k: v for k, v in auth.items() if k != "admin_key"}}
    return {**d, "admin_key": auth["admin_key"], "gateway": gateway}


def serve_file(path: str | Path | None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The file's mapping (none: empty) with ``overrides`` merged over it, as written:
    what a child ``llmserve serve`` is given to read the same configuration."""
    data: dict[str, Any] = {}
    if path is not None:
        data = yaml_mapping(path, empty_ok=True)
    return deep_merge(data, overrides or {})
