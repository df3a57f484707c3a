"""Tracing settings: typed, validated once, read from a flag or the standard variable."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"  # OpenTelemetry's own name: collectors' docs use it
TRACES_PATH = "/v1/traces"


class TracingConfig(BaseModel):
    """``otlp_endpoint``: an OTLP/HTTP collector's base URL (``http://host:4318``; the
    traces path is added as OpenTelemetry's exporters do), or None: tracing off.
    ``sample_ratio``: the share of new traces recorded (a request that arrives with a
    traceparent follows its caller's decision, so one trace is whole or absent).
    ``access_log``: one JSON line per request on the ``llmserve.access`` logger."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    otlp_endpoint: str | None = None
    service_name: str = "llmserve"
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    access_log: bool = False

    @field_validator("otlp_endpoint")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"otlp endpoint must be an http(s) URL, got {v!r}")
        return v.rstrip("/")

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None

    @property
    def traces_url(self) -> str:
        assert self.otlp_endpoint is not None
        e = self.otlp_endpoint
        return e if e.endswith(TRACES_PATH) else e + TRACES_PATH

    @classmethod
    def resolve(cls, flag: str | None, env: Mapping[str, str], service_name: str,
                access_log: bool = False, sample_ratio: float = 1.0) -> TracingConfig:
        """The flag wins over the environment (called once, by the CLI)."""
        return cls(otlp_endpoint=flag or env.get(ENV_ENDPOINT) or None, service_name=service_name,
                   access_log=access_log, sample_ratio=sample_ratio)

