"""Arrival-rate forecasting: Holt's linear trend, plus an optional daily profile.

Scaling up takes a cold start of minutes, so the policy has to act on the rate a
few minutes ahead, not the one now. Holt's method (a smoothed level and a smoothed
slope) is the simplest forecaster that follows a ramp without lagging behind it;
the seasonal profile adds what yesterday looked like at the same hour, which a
trend cannot know (the morning rise starts before the trend sees it).

Everything here is pure and time-aware: smoothing weights come from time
constants and the actual gap between observations, so an irregular or changed
tick does not change what the forecaster means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HoltState:
    """Smoothed level (units of y) and trend (units of y per second) at time ``t``."""

    level: float
    trend: float
    t: float
    updates: int = 1


def _weight(dt: float, tau: float) -> float:
    return 1.0 - math.exp(-dt / tau)


def holt_update(state: HoltState | None, t: float, y: float, level_tau_s: float,
                trend_tau_s: float) -> HoltState:
    """Fold observation ``y`` at time ``t`` into the level and trend.

    The first observation sets the level with a zero trend. An observation that is
    not later than the state's time is ignored.
    """
    if state is None:
        return HoltState(float(y), 0.0, float(t))
    dt = t - state.t
    if dt <= 0:
        return state
    alpha, beta = _weight(dt, level_tau_s), _weight(dt, trend_tau_s)
    level = alpha * y + (1.0 - alpha) * (state.level + state.trend * dt)
    trend = beta * (level - state.level) / dt + (1.0 - beta) * state.trend
    return HoltState(level, trend, float(t), state.updates + 1)


def ewma_update(state: tuple[float, float] | None, t: float, y: float, tau_s: float) -> tuple[float, float]:
    """A plain exponential average ``(value, t)``: no trend, so it never overshoots below 0."""
    if state is None:
        return float(y), float(t)
    value, t0 = state
    if t <= t0:
        return state
    return value + (y - value) * _weight(t - t0, tau_s), float(t)


def holt_forecast(state: HoltState, horizon_s: float) -> float:
    """The value expected ``horizon_s`` seconds after the state's time (not clamped)."""
    return state.level + state.trend * horizon_s


@dataclass(frozen=True, slots=True)
class SeasonalProfile:
    """Mean of y per time-of-period bin, smoothed across periods.

    ``values[b]`` is the smoothed mean of bin ``b`` over completed visits (None
    until the bin has been seen once in full); ``acc_*`` accumulate the visit in
    progress, which is folded in when the bin is next entered in a later period.
    """

    period_s: float
    values: tuple[float | None, ...]
    acc_sum: tuple[float, ...]
    acc_n: tuple[int, ...]
    acc_period: tuple[int, ...]

    @classmethod
    def empty(cls, period_s: float, bins: int) -> "SeasonalProfile":
        return cls(period_s, (None,) * bins, (0.0,) * bins, (0,) * bins, (-1,) * bins)

    @property
    def bins(self) -> int:
        return len(self.values)

    @property
    def complete(self) -> bool:
        """True once every bin holds at least one full visit."""
        return all(v is not None for v in self.values)

    def _bin(self, t: float) -> tuple[int, int]:
        period = math.floor(t / self.period_s)
        frac = (t - period * self.period_s) / self.period_s
        return min(int(frac * self.bins), self.bins - 1), period

    def value_at(self, t: float) -> float | None:
        """Linear interpolation between bin centres, wrapping around the period."""
        if not self.complete:
            return None
        pos = (t % self.period_s) / self.period_s * self.bins - 0.5
        lo = math.floor(pos)
        frac = pos - lo
        a, b = self.values[lo % self.bins], self.values[(lo + 1) % self.bins]
        return a + (b - a) * frac  # type: ignore[operator]


def seasonal_update(profile: SeasonalProfile, t: float, y: float, tau_periods: float) -> SeasonalProfile:
    """Add observation ``y`` at time ``t`` to its bin."""
    b, period = profile._bin(t)
    values, acc_sum, acc_n, acc_period = (list(profile.values), list(profile.acc_sum),
                                          list(profile.acc_n), list(profile.acc_period))
    if acc_period[b] != period:
        if acc_n[b] > 0:
            mean = acc_sum[b] / acc_n[b]
            old = values[b]
            values[b] = mean if old is None else old + (mean - old) * _weight(1.0, tau_periods)
        acc_sum[b], acc_n[b], acc_period[b] = 0.0, 0, period
    acc_sum[b] += y
    acc_n[b] += 1
    # A bin whose visit is over (we moved to the next bin) is folded right away so
    # that one full period suffices to complete the profile.
    prev = (b - 1) % profile.bins
    if acc_n[prev] > 0 and prev != b:
        mean = acc_sum[prev] / acc_n[prev]
        old = values[prev]
        values[prev] = mean if old is None else old + (mean - old) * _weight(1.0, tau_periods)
        acc_sum[prev], acc_n[prev] = 0.0, 0
    return SeasonalProfile(profile.period_s, tuple(values), tuple(acc_sum), tuple(acc_n), tuple(acc_period))


def seasonal_delta(profile: SeasonalProfile, t: float, horizon_s: float) -> float | None:
    """How much the profile expects y to change between ``t`` and ``t + horizon_s``."""
    now, ahead = profile.value_at(t), profile.value_at(t + horizon_s)
    if now is None or ahead is None:
        return None
    return ahead - now

