"""A multi-version deployment: what ``models:`` in ``llmserve serve``'s file says.

Each served model lists its versions; each version is one elastic pool, with its
own weights or engine, its own engine flags and its own ``autoscale`` (deep-merged
over the file's top-level ``autoscale``, so the top level holds the defaults of
every pool). A model may name a canary (the gateway's
:class:`~llmserve.gateway.config.CanarySettings`) that moves traffic from
``stable`` to ``version``; each pool's controller sees only its own version's
arrivals, so capacity follows the weight the analysis sets.

The file's single-model keys (``model``, ``version``, ``served_model_name``,
``engine_args``...) are the one-version deployment: :func:`pools_of` turns both
shapes into the same list of :class:`PoolDeployment`, which is all the rest of
``llmserve serve`` reads. A version may name a ``command`` instead of a model: any
OpenAI-compatible server, started and scaled through the same providers, probed
on its ``ready_path`` and read through its ``/metrics``. See ``docs/deployments.md``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmserve.autoscale.config import AutoscaleConfig
from llmserve.flags import flag_error, given
from llmserve.gateway.config import AdapterConfig, CanarySettings, PoolSettings

# Flags that serve sets itself on every instance.
RESERVED_ENGINE_FLAGS = ("--host", "--port", "--instance-id", "--model", "--served-model-name", "--threads",
                         "--instances", "--startup-delay", "--model-store", "--api-key")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def check_engine_args(args: list[str]) -> list[str]:
    """``args`` if ``llmserve engine`` takes them and serve does not set them itself: a typo
    found at load, not as an instance that exits at every start."""
    import argparse

    from llmserve.engine.argv import add_engine_args
    from llmserve.server.entry import add_server_args

    for a in args:
        if a.split("=")[0] in RESERVED_ENGINE_FLAGS:
            raise ValueError(f"set {a} through serve's own settings, not engine_args")
    parser = argparse.ArgumentParser(prog="llmserve engine", add_help=False, exit_on_error=False)
    add_engine_args(parser)
    add_server_args(parser)
    try:
        given_args, unknown = parser.parse_known_args(args)
    except argparse.ArgumentError as e:
        raise ValueError(str(e)) from None
    if unknown:
        raise ValueError(f"llmserve engine does not take {' '.join(unknown)}")
    # The values too (--max-num-seqs -3), as the instance would check them at every start.
    from llmserve.engine.argv import engine_config_from
    from llmserve.engine.config import EngineConfig
    from llmserve.server.config import ServerConfig

    try:
        engine_config_from(given_args)
        ServerConfig(**given(ServerConfig, given_args))
    except ValidationError as e:
        raise ValueError(flag_error(e, EngineConfig, ServerConfig)) from None
    return args


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VersionDeployment(_Strict):
    name: str
    model: str | None = None  # store name, .gguf file or HF folder; with command: what {model} becomes
    # A foreign OpenAI-compatible server instead of llmserve engine, one shell-quoted
    # string with {host}, {port} (required) and {model}: "vllm serve {model} --port {port}".
    command: str | None = None
    ready_path: str | None = None  # default: /ready (llmserve), /health (command)
    load_source: Literal["load", "metrics"] | None = None  # default: load (llmserve), metrics (command)
    # Relative traffic weight. None: 1, or 0 for the canary version (its analysis owns it).
    weight: float | None = Field(None, ge=0.0)
    engine_args: list[str] = Field(default_factory=list)
    autoscale: dict[str, Any] = Field(default_factory=dict)  # over the top-level autoscale
    threads_per_instance: int | None = Field(None, ge=1)
    cold_start_delay_s: float | None = Field(None, ge=0.0)
    # A LoRA adapter on another version's pool (docs/lora-versions.md): no pool, no engine of its own.
    pool: str | None = None
    adapter: AdapterConfig | None = None

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, args: list[str]) -> list[str]:
        return check_engine_args(args)

    @model_validator(mode="after")
    def _source(self) -> VersionDeployment:
        where = f"versions[{self.name}]"
        if self.adapter is not None:
            own = sorted(self.model_fields_set - {"name", "weight", "pool", "adapter"})
            if own:
                raise ValueError(f"{where}: {', '.join(own)}: an adapter version runs on the pool of "
                                 f"{self.pool!r} and has none of its own")
            return self
        if self.command is None:
            if self.model is None:
                raise ValueError(f"{where}: give a model (or a command for a foreign server)")
            return self
        if "{port}" not in self.command:
            raise ValueError(f"{where}.command: it must take the port the provider picks: {{port}}")
        for key in ("engine_args", "threads_per_instance", "cold_start_delay_s"):
            if key in self.model_fields_set:
                raise ValueError(f"{where}.{key}: llmserve engine settings; a command says its own flags")
        if self.ready_path is not None and not self.ready_path.startswith("/"):
            raise ValueError(f"{where}.ready_path: a path starting with /")
        return self


class ModelDeployment(_Strict):
    name: str  # the served model name clients put in "model"
    versions: list[VersionDeployment] = Field(min_length=1)
    canary: CanarySettings | None = None
    # Seconds a user stays on the version they were routed to while weights move
    # (see gateway/version_router.py); 0: pure weighted hashing.
    stickiness_window_s: float = Field(600.0, ge=0.0)
    # The model's own keys over the file's top-level pool: ServeConfig merges them
    # before this is validated, so a misspelt key fails here, at models[i].pool.
    pool: PoolSettings = PoolSettings()
    # What a key's money budget is charged for this model (the gateway's fields of the name)
    price_per_1k_prompt_tokens: float = Field(0.0, ge=0.0)
    price_per_1k_completion_tokens: float = Field(0.0, ge=0.0)
    # Other names for "model", each pinned to a version (the gateway's aliases: an adapter's own name)
    aliases: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names(self) -> ModelDeployment:
        names = [v.name for v in self.versions]
        if len(set(names)) != len(names):
            raise ValueError(f"models[{self.name}].versions: names must be unique, got {names}")
        return self

    def weight(self, v: VersionDeployment) -> float:
        if v.weight is not None:
            return v.weight
        return 0.0 if self.canary is not None and self.canary.version == v.name else 1.0


@dataclass(frozen=True, slots=True)
class PoolDeployment:
    """One elastic pool: one version of one served model, fully resolved."""

    model: str  # served name
    version: str
    source: str  # what --model gets
    weight: float
    engine_args: tuple[str, ...]
    autoscale: AutoscaleConfig  # the file's, with the version's own keys merged over it
    threads_per_instance: int | None
    cold_start_delay_s: float
    command: tuple[str, ...] = ()  # a foreign server's argv ({host}, {port} left for the provider)
    ready_path: str = "/ready"
    load_source: str = "load"
    upstream_model: str | None = None  # the name a foreign server knows the model by
    adapter_versions: tuple[str, ...] = ()  # adapter versions served by this pool's instances

    @property
    def key(self) -> str:
        return f"{self.model}/{self.version}"


def served_name_of(model: str) -> str:
    from llmserve.models.store import served_name

    return served_name(model)


def merged_autoscale(base: AutoscaleConfig, over: dict[str, Any], where: str) -> AutoscaleConfig:
    """``over`` (a version's partial ``autoscale``) deep-merged over ``base``, validated."""
    if not over:
        return base
    try:
        return AutoscaleConfig.model_validate(deep_merge(base.model_dump(), over))
    except ValidationError as e:  # one line: it ends up inside the file's own error
        raise ValueError(f"{where}.autoscale: {flag_error(e)}") from None
    except ValueError as e:
        raise ValueError(f"{where}.autoscale: {e}") from None


def pools_of(models: list[ModelDeployment], autoscale: AutoscaleConfig, engine_args: tuple[str, ...],
             threads: int | None, cold_start_delay_s: float) -> list[PoolDeployment]:
    """Every pool of a ``models:`` list, with the top-level defaults applied (the
    top-level engine flags first: a version's own come later and win)."""
    out = []
    for m in models:
        for v in m.versions:
            if v.adapter is not None:
                continue  # served by its pool's instances (their controller counts its traffic)
            adapters = tuple(a.name for a in m.versions if a.pool == v.name)
            auto = merged_autoscale(autoscale, v.autoscale, f"models[{m.name}].versions[{v.name}]")
            if v.command is not None:
                argv = tuple(a.replace("{model}", v.model or m.name) for a in shlex.split(v.command))
                out.append(PoolDeployment(m.name, v.name, v.model or v.command, m.weight(v), (), auto, None, 0.0,
                                          argv, v.ready_path or "/health", v.load_source or "metrics",
                                          v.model, adapters))
                continue
            out.append(PoolDeployment(
                m.name, v.name, v.model, m.weight(v), engine_args + tuple(v.engine_args), auto,
                v.threads_per_instance if v.threads_per_instance is not None else threads,
                v.cold_start_delay_s if v.cold_start_delay_s is not None else cold_start_delay_s,
                (), v.ready_path or "/ready", v.load_source or "load", None, adapters))
    return out
