"""What one key may use (``auth.keys[].limits`` in gateway.yaml) and what a model costs."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Period(str, Enum):
    """How often a budget starts again (UTC calendar periods); ``total``: never."""

    HOUR = "hour"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    TOTAL = "total"


class Budget(_Strict):
    """A spend cap per period: ``amount`` in the currency of the models' prices
    (tokens x ``price_per_1k_*`` / 1000), or ``tokens`` (prompt + completion), not both."""

    amount: float | None = Field(None, gt=0.0)
    tokens: int | None = Field(None, ge=1)
    period: Period = Period.MONTH

    @model_validator(mode="after")
    def _one(self) -> Budget:
        if (self.amount is None) == (self.tokens is None):
            raise ValueError("a budget has either an amount or tokens")
        return self


class KeyLimits(_Strict):
    """Caps on one key, across every replica. A request counts in a sliding window of
    ``window_s``; ``requests_per_minute`` / ``tokens_per_minute`` are the usual way to say
    it (a 60 s window); ``requests`` / ``tokens`` cap any other window length."""

    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    requests: int | None = Field(None, ge=1)  # per window_s
    tokens: int | None = Field(None, ge=1)  # prompt + completion, per window_s
    window_s: float = Field(60.0, ge=1.0, le=86400.0)
    max_concurrent: int | None = Field(None, ge=1)
    budget: Budget | None = None
    # A request without max_tokens reserves this many completion tokens at admission;
    # the actual usage is settled when it ends.
    default_max_tokens: int = Field(1024, ge=1)
    # A stream whose budget cannot cover its whole estimate reserves this many tokens at a
    # time as it runs; when the budget refuses the next batch, it ends with an
    # insufficient_quota event.
    stream_charge_tokens: int = Field(32, ge=1)

    @model_validator(mode="after")
    def _window(self) -> KeyLimits:
        per_minute = self.requests_per_minute is not None or self.tokens_per_minute is not None
        if per_minute and (self.requests is not None or self.tokens is not None):
            raise ValueError("give requests/tokens per window_s or requests/tokens_per_minute, not both")
        if per_minute and self.window_s != 60.0:
            raise ValueError("requests_per_minute and tokens_per_minute mean window_s 60; "
                             "use requests/tokens for another window")
        return self

    @property
    def request_cap(self) -> int | None:
        return self.requests if self.requests is not None else self.requests_per_minute

    @property
    def token_cap(self) -> int | None:
        return self.tokens if self.tokens is not None else self.tokens_per_minute


class Prices(_Strict):
    """A served model's price per 1,000 tokens (``price_per_1k_*`` on its config)."""

    prompt: float = Field(0.0, ge=0.0)
    completion: float = Field(0.0, ge=0.0)
