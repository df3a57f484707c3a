"""The gateway's typed configuration: the schema of ``gateway.yaml``.

Loaded and validated once at start (``GatewayConfig.load``), then passed down;
nothing below reads files or the environment. See ``docs/gateway.example.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator,
                      model_validator)

from llmserve.gateway.admission import AdmissionConfig, ConcurrencyConfig
from llmserve.gateway.auth import ClientAuth, Privileges
from llmserve.gateway.balancer.picker import BalancerConfig
from llmserve.gateway.batches.config import BatchConfig, StateConfig
from llmserve.gateway.canary import CanaryConfig
from llmserve.gateway.circuit import BreakerConfig
from llmserve.gateway.health import OutlierConfig, RetryBudgetConfig
from llmserve.gateway.tenants.config import KeyLimits
from llmserve.http_guard import Count, HttpLimits, Seconds
from llmserve.priority import PriorityClass

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def checked_name(kind: str, v: str) -> str:
    if not _NAME.match(v):
        raise ValueError(f"{kind} name {v!r}: use letters, digits and . _ : / -")
    return v


def normalize_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing slash; raises ValueError."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"upstream {url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"upstream {url!r} has no host")
    if parts.query or parts.fragment:
        raise ValueError(f"upstream {url!r} must not have a query or fragment")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as e:
        raise ValueError(f"upstream {url!r}: {e}") from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


class AdapterConfig(_Strict):
    """A LoRA adapter served on another version's pool (docs/lora-versions.md)."""

    name: str  # what the engines call it: the request's "model" upstream
    # Where the engines load it from (POST /v1/load_lora_adapter); None: only where
    # the engines have it already (their --lora-modules).
    path: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return checked_name("adapter", v)


class VersionConfig(_Strict):
    name: str
    weight: float = Field(ge=0.0)  # relative; normalised over the model's versions
    upstreams: list[str] = Field(default_factory=list)  # base URLs; may start empty
    upstream_model: str | None = None  # rewrite the request's "model" to this upstream
    api_key: SecretStr | None = None  # sent to these upstreams as Authorization: Bearer
    # A version that is an adapter on another version's pool: no upstreams of its own.
    pool: str | None = None  # the version whose instances serve it
    adapter: AdapterConfig | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return checked_name("version", v)

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        out = [normalize_url(u) for u in urls]
        dupes = sorted({u for u in out if out.count(u) > 1})
        if dupes:
            raise ValueError(f"upstreams listed twice: {dupes}")
        return out

    @model_validator(mode="after")
    def _adapter(self) -> VersionConfig:
        if (self.pool is None) != (self.adapter is None):
            raise ValueError(f"version {self.name!r}: an adapter version names both pool and adapter")
        if self.adapter is not None:
            own = [k for k in ("upstreams", "upstream_model", "api_key") if getattr(self, k)]
            if own:
                raise ValueError(f"version {self.name!r}: {', '.join(own)}: an adapter version runs on "
                                 f"the pool of {self.pool!r} and has none of its own")
        return self


class CanarySettings(CanaryConfig):
    """A rollout of ``version`` against ``stable``; the analysis owns ``version``'s weight."""

    version: str
    stable: str
    auto_start: bool = True  # start the rollout when the gateway starts
    # Requests that forced their version (x-llmserve-version) in the analysis's stats:
    # off, so a tester's forced traffic cannot promote or roll back a canary.
    count_forced: bool = False


class PoolSettings(_Strict):
    """How one model's requests are admitted, capped and balanced (``pool:`` in serve's file)."""

    admission: AdmissionConfig = AdmissionConfig()
    concurrency: ConcurrencyConfig = ConcurrencyConfig()
    balancer: BalancerConfig = BalancerConfig()


class ServedModelConfig(PoolSettings):
    name: str  # the served model name clients put in "model"
    versions: list[VersionConfig] = Field(min_length=1)
    canary: CanarySettings | None = None
    # Seconds a user stays on the version they were routed to while weights move
    # (the rule: gateway/version_router.py); 0: pure weighted hashing, no memory.
    stickiness_window_s: float = Field(0.0, ge=0.0)
    # Other names clients may put in "model", each pinned to one version: a LoRA adapter
    # version's own name, as vLLM serves adapters (the version's traffic outside the weights).
    aliases: dict[str, str] = Field(default_factory=dict)
    # What a key's budget is charged (tokens x price / 1000; gateway/tenants).
    price_per_1k_prompt_tokens: float = Field(0.0, ge=0.0)
    price_per_1k_completion_tokens: float = Field(0.0, ge=0.0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return checked_name("model", v)

    @model_validator(mode="after")
    def _check(self) -> ServedModelConfig:
        names = [v.name for v in self.versions]
        if len(set(names)) != len(names):
            raise ValueError(f"model {self.name!r}: version names must be unique, got {names}")
        urls = [u for v in self.versions for u in v.upstreams]
        dupes = sorted({u for u in urls if urls.count(u) > 1})
        if dupes:
            raise ValueError(f"model {self.name!r}: upstreams in more than one version: {dupes}")
        c = self.canary
        if c is not None:
            for role, v in (("canary version", c.version), ("stable version", c.stable)):
                if v not in names:
                    raise ValueError(f"model {self.name!r}: {role} {v!r} is not among {names}")
            if c.version == c.stable:
                raise ValueError(f"model {self.name!r}: canary and stable must differ")
            if self.version(c.version).weight != 0:
                raise ValueError(f"model {self.name!r}: the canary analysis sets the weight of "
                                 f"{c.version!r}; give it weight 0 in the config")
        if sum(v.weight for v in self.versions) <= 0:
            raise ValueError(f"model {self.name!r}: the version weights sum to 0")
        self._check_adapters(names)
        for alias, version in self.aliases.items():
            checked_name("model", alias)
            if version not in names:
                raise ValueError(f"model {self.name!r}: alias {alias!r} names version {version!r}, not among {names}")
        return self

    def _check_adapters(self, names: list[str]) -> None:
        adapters = [v for v in self.versions if v.adapter is not None]
        for v in adapters:
            if v.pool not in names or self.version(v.pool).adapter is not None:
                full = [n for n in names if self.version(n).adapter is None]
                raise ValueError(f"model {self.name!r}: version {v.name!r} names pool {v.pool!r}; "
                                 f"an adapter runs on a version with its own pool: {full}")
        given = [v.adapter.name for v in adapters]
        dupes = sorted({a for a in given if given.count(a) > 1})
        if dupes:
            raise ValueError(f"model {self.name!r}: adapters named by more than one version: {dupes}")

    def version(self, name: str) -> VersionConfig:
        return next(v for v in self.versions if v.name == name)

    def pool_of(self, name: str) -> str:
        """The version whose pool serves version ``name`` (itself, unless an adapter)."""
        return self.version(name).pool or name

    @property
    def base_weights(self) -> dict[str, float]:
        return {v.name: v.weight for v in self.versions}


def _class_name(v: object) -> object:
    """YAML says ``realtime`` / ``batch``; the enum's values are 0 / 1."""
    if isinstance(v, str):
        try:
            return PriorityClass[v.strip().upper()]
        except KeyError:
            raise ValueError(f"a priority class is 'realtime' or 'batch', got {v!r}") from None
    return v


ClassName = Annotated[PriorityClass, BeforeValidator(_class_name)]


class PrivilegeConfig(_Strict):
    """What a client may ask for; the rule is in ``gateway/auth.py``."""

    priorities: list[ClassName] | None = None  # None: its default and every less urgent class
    default_priority: ClassName | None = None  # None: auth.default_priority
    priority_range: tuple[int, int] | None = None  # integers sent on as they are; None: as their class
    version_override: bool = False  # may force a version with x-llmserve-version

    def privileges(self, default: PriorityClass) -> Privileges:
        return Privileges.build(self.default_priority if self.default_priority is not None else default,
                                self.priorities, self.priority_range, self.version_override)


class ClientKey(PrivilegeConfig):
    key: SecretStr
    # How metrics, the usage API and error messages name the key (never by its secret).
    name: str | None = None
    limits: KeyLimits | None = None  # needs a name (docs/keys.md)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError(f"key name {v!r}: use letters, digits and . _ : / -")
        return v

    @model_validator(mode="after")
    def _named(self) -> ClientKey:
        if self.limits is not None and self.name is None:
            raise ValueError("a key with limits needs a name")
        return self


class AuthConfig(_Strict):
    """Client keys, with their privileges; no key at all: an open gateway."""

    api_keys: list[SecretStr] = Field(default_factory=list)  # keys with default privileges
    keys: list[ClientKey] = Field(default_factory=list)  # keys with their own
    default_priority: ClassName = PriorityClass.REALTIME  # a request that claims none
    open_privileges: PrivilegeConfig = PrivilegeConfig()  # every client's when no key is set
    admin_key: SecretStr | None = None  # unset: the admin API is disabled

    @model_validator(mode="after")
    def _keys(self) -> AuthConfig:
        given = [k.get_secret_value() for k in self.api_keys] + \
                [k.key.get_secret_value() for k in self.keys]
        if any(len(k) < 8 for k in given):
            raise ValueError("API keys must be at least 8 characters")
        if len(set(given)) != len(given):
            raise ValueError("an API key is listed twice (api_keys and keys together)")
        names = [k.name for k in self.keys if k.name is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"key names must be unique, got {names}")
        for i, k in enumerate(self.keys):
            try:
                k.privileges(self.default_priority)
            except ValueError as e:
                raise ValueError(f"auth.keys[{i}]: {e}") from None
        try:
            self.open_privileges.privileges(self.default_priority)
        except ValueError as e:
            raise ValueError(f"auth.open_privileges: {e}") from None
        return self

    @field_validator("admin_key")
    @classmethod
    def _admin(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and len(key.get_secret_value()) < 16:
            raise ValueError("the admin key must be at least 16 characters")
        return key

    def client_auth(self) -> ClientAuth:
        default = PrivilegeConfig().privileges(self.default_priority)
        keys = {k.get_secret_value(): default for k in self.api_keys}
        keys.update({k.key.get_secret_value(): replace(k.privileges(self.default_priority), key=k.name)
                     for k in self.keys})
        return ClientAuth(keys, self.open_privileges.privileges(self.default_priority))


class LimitsConfig(HttpLimits):
    """What one client may send and hold. The connection-level ones are the shared
    :class:`~llmserve.http_guard.HttpLimits` (enforced by ``llmserve.http_guard`` on
    every way the gateway is served), with the gateway's defaults."""

    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    # All request headers together: twice the instance's 16 KiB, for clients' own
    # tracing and auth headers, which the gateway does not forward.
    max_header_bytes: Annotated[Count, Field(ge=1024)] = 32 * 1024
    max_url_bytes: Annotated[Count, Field(ge=256)] = 8 * 1024
    # Slower than the instance's head and body timeouts is a slowloris, not a client.
    keep_alive_timeout_s: Seconds = 30.0  # idle client connections
    # Each stream holds a connection for its whole length: far above the instances' batches.
    max_connections: Count = 4096
    connect_timeout_s: float = Field(5.0, gt=0.0)
    request_timeout_s: float = Field(600.0, gt=0.0)  # upstream, whole response


class PollingConfig(_Strict):
    load_interval_s: float = Field(0.25, gt=0.0)  # GET /load (or /metrics)
    ready_interval_s: float = Field(2.0, gt=0.0)  # GET /ready
    timeout_s: float = Field(1.0, gt=0.0)


class RetryConfig(_Strict):
    max_attempts: int = Field(3, ge=1)  # tries per request, first included
    # A stream broken after its first event goes on elsewhere (gateway/resume.py); 0: off.
    max_resumes: int = Field(2, ge=0)
    budget: RetryBudgetConfig = RetryBudgetConfig()


class GatewaySettings(_Strict):
    """Everything but the models (``gateway:`` in serve's file, which sets the models itself)."""

    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    polling: PollingConfig = PollingConfig()
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    outlier: OutlierConfig = OutlierConfig()
    state: StateConfig = StateConfig()  # batches and stored responses survive restarts here
    batches: BatchConfig = BatchConfig()


class GatewayConfig(GatewaySettings):
    models: list[ServedModelConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> GatewayConfig:
        names = [m.name for m in self.models] + [a for m in self.models for a in m.aliases]
        if len(set(names)) != len(names):
            raise ValueError(f"model names and aliases must be unique, got {names}")
        priced = any(m.price_per_1k_prompt_tokens or m.price_per_1k_completion_tokens for m in self.models)
        for k in self.auth.keys:  # (an amount budget no request is charged against would never bind)
            if k.limits and k.limits.budget and k.limits.budget.amount is not None and not priced:
                raise ValueError(f"auth.keys[{k.name}].limits.budget: an amount budget needs a model's "
                                 "price_per_1k_prompt_tokens or price_per_1k_completion_tokens")
        return self

    def model(self, name: str) -> ServedModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    @classmethod
    def load(cls, path: str | Path) -> GatewayConfig:
        return cls.model_validate(yaml_mapping(path))


def yaml_mapping(path: str | Path, empty_ok: bool = False) -> dict[str, Any]:
    """A config file's top-level mapping; a YAML syntax error is a ValueError in one line."""
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ValueError(f"{path}: not valid YAML: {what}{where}") from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data
