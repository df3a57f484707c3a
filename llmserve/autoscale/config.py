"""Typed configuration for the scaling policies and the bounds wrapped around them.

One frozen object, :class:`AutoscaleConfig`, is validated once (``model_validate``
of a YAML section, CLI flags or a test) and passed down; unknown keys are errors.
The live controller and the capacity simulator both hand it to
:func:`llmserve.autoscale.build_policy`, so they run the exact same stack. The
``llmserve serve`` and ``llmserve simulate`` flags are generated from these fields.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.autoscale.capacity_classes import CapacityConfig
from llmserve.flags import Flag

PolicyName = Literal["threshold", "kpa", "predictive", "static"]
POLICY_NAMES: tuple[str, ...] = ("threshold", "kpa", "predictive", "static")
UtilisationMetric = Literal["busy", "kv", "batch"]


def _check(ok: bool, name: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"autoscale config: {name} {msg}")


class _Config(BaseModel):
    """Frozen, unknown keys refused; each section checks itself after its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="after")
    def _validated(self):
        self._check_values()
        return self

    def _check_values(self) -> None:
        pass


class SLOConfig(_Config):
    """Latency targets seen at the gateway: what every policy is trying to keep."""

    ttft_s: Annotated[float, Flag(name="--ttft-slo")] = Field(2.0, description="TTFT SLO, seconds")
    e2e_s: Annotated[float, Flag(name="--e2e-slo")] = Field(60.0, description="end-to-end SLO, seconds")

    def _check_values(self) -> None:
        _check(self.ttft_s > 0, "slo.ttft_s", f"must be positive, got {self.ttft_s}")
        _check(self.e2e_s > 0, "slo.e2e_s", f"must be positive, got {self.e2e_s}")


class BoundsConfig(_Config):
    """Limits applied around any policy (see :mod:`llmserve.autoscale.bounds`).

    Scale-up reacts fast (a short cooldown) and scale-down slowly (the maximum
    desired count over a long window), because a missing instance costs SLO
    while a spare one only costs money, and flapping costs both.
    """

    min_instances: int = Field(1, description="instances at least (0: scale to zero)")
    max_instances: int = Field(64, description="instances at most")
    scale_up_cooldown_s: float = Field(15.0, description="seconds between scale-ups")
    scale_down_window_s: float = Field(300.0, description="scale down to the most wanted over this many seconds")
    max_step_up: int = Field(8, description="instances added in one decision at most")
    max_step_down: int = Field(2, description="instances removed in one decision at most")

    def _check_values(self) -> None:
        _check(self.min_instances >= 0, "bounds.min_instances", f"must be >= 0, got {self.min_instances}")
        _check(self.max_instances >= max(1, self.min_instances), "bounds.max_instances",
               f"must be >= max(1, min_instances), got {self.max_instances}")
        _check(self.scale_up_cooldown_s >= 0, "bounds.scale_up_cooldown_s", "must be >= 0")
        _check(self.scale_down_window_s >= 0, "bounds.scale_down_window_s", "must be >= 0")
        _check(self.max_step_up >= 1, "bounds.max_step_up", f"must be >= 1, got {self.max_step_up}")
        _check(self.max_step_down >= 1, "bounds.max_step_down", f"must be >= 1, got {self.max_step_down}")


class ThresholdConfig(_Config):
    """The classic reactive baseline.

    ``metric`` picks the utilisation signal: ``busy`` (share of wall time in
    forward passes), ``kv`` (KV cache usage) or ``batch`` (running / max_num_seqs).
    The default is ``batch`` because a continuous-batching engine is "busy" as soon
    as one request is decoding, so busy fraction saturates long before capacity.
    """

    metric: UtilisationMetric = "batch"
    scale_up_utilisation: float = 0.8
    scale_down_utilisation: float = 0.4
    target_utilisation: float = 0.6
    max_queue_per_instance: float = 0.5
    latency_step: int = 1

    def _check_values(self) -> None:
        _check(0 < self.scale_down_utilisation < self.scale_up_utilisation <= 1.0, "threshold",
               "needs 0 < scale_down_utilisation < scale_up_utilisation <= 1")
        _check(self.scale_down_utilisation <= self.target_utilisation <= self.scale_up_utilisation,
               "threshold.target_utilisation", "must lie between the down and up thresholds")
        _check(self.max_queue_per_instance >= 0, "threshold.max_queue_per_instance", "must be >= 0")
        _check(self.latency_step >= 1, "threshold.latency_step", "must be >= 1")


class KPAConfig(_Config):
    """Knative Pod Autoscaler defaults: 60 s stable window, 6 s panic window, panic at 2x.

    ``target_concurrency`` per instance, when unset, is ``target_utilisation`` (Knative's
    container-concurrency-target-percentage, 70 %) of the seats the instances report
    (their ``max_num_seqs``), so KPA scales a pool of any instance size."""

    target_concurrency: float | None = None
    target_utilisation: float = 0.7
    default_seats: float = 16.0  # until a first load report says how many seats an instance has
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0

    def _check_values(self) -> None:
        _check(self.target_concurrency is None or self.target_concurrency > 0, "kpa.target_concurrency",
               "must be positive")
        _check(0 < self.target_utilisation <= 1, "kpa.target_utilisation", "must be in (0, 1]")
        _check(self.default_seats > 0, "kpa.default_seats", "must be positive")
        _check(0 < self.panic_window_s <= self.stable_window_s, "kpa.panic_window_s",
               "must be positive and no longer than the stable window")
        _check(self.panic_threshold > 1.0, "kpa.panic_threshold", "must be > 1")
        _check(self.max_scale_up_rate > 1.0, "kpa.max_scale_up_rate", "must be > 1")
        _check(self.max_scale_down_rate > 1.0, "kpa.max_scale_down_rate", "must be > 1")


class PredictiveConfig(_Config):
    """Forecast-driven policy (see :mod:`llmserve.autoscale.predictive`).

    ``lead_time_s`` is how far ahead capacity must be started: the cold start plus
    one controller tick. ``capacity_tokens_per_s`` is the prior for one instance's
    saturation throughput (prompt + output tokens/s with every batch seat taken);
    the policy measures it online (:mod:`llmserve.autoscale.saturation`): from the
    step models llmserve instances report (the first replaces the prior), and from
    saturated ticks, and plans each instance at ``target_utilisation`` of it.
    ``capacity_from_model: false`` ignores the step models (a test that stands a
    fast model in for a slow one by a fixed prior). ``margin_z`` is the
    square-root-staffing factor: N = R + z * sqrt(R) for an offered load of R
    instances, so the relative headroom shrinks as the pool grows. The defaults
    (full utilisation, z = 0.65, level smoothed over 120 s) are what met the
    capacity simulator's diurnal target (``benchmarks/sim/README.md``): the
    square-root margin alone is the headroom.
    """

    lead_time_s: float = 150.0
    level_tau_s: float = 120.0
    trend_tau_s: float = 900.0
    seasonality: bool = False
    season_period_s: float = 86400.0
    season_bins: int = 288
    season_tau_periods: float = 1.0
    capacity_tokens_per_s: float = 1000.0
    capacity_tau_s: float = 300.0
    capacity_measure_fill: float = 0.95
    capacity_from_model: bool = True
    target_utilisation: float = 1.0
    margin_z: float = 0.65
    # Letting go: a fast average of arrivals (let_go_tau_s) that falls under let_go_ratio
    # of the smoothed level replaces it, so a forecast stops reporting load that has
    # stopped arriving within a few ticks; pacing the scale-down is the bounds' job.
    let_go_tau_s: float = 10.0
    let_go_ratio: float = 0.5
    max_queue_per_instance: float = 0.5
    fallback_fill: float = 0.8
    fallback_step_fraction: float = 0.25

    def _check_values(self) -> None:
        _check(self.lead_time_s >= 0, "predictive.lead_time_s", "must be >= 0")
        _check(self.level_tau_s > 0 and self.trend_tau_s > 0, "predictive.*_tau_s", "must be positive")
        _check(self.season_period_s > 0, "predictive.season_period_s", "must be positive")
        _check(self.season_bins >= 2, "predictive.season_bins", "must be >= 2")
        _check(self.season_tau_periods > 0, "predictive.season_tau_periods", "must be positive")
        _check(self.capacity_tokens_per_s > 0, "predictive.capacity_tokens_per_s", "must be positive")
        _check(self.capacity_tau_s > 0, "predictive.capacity_tau_s", "must be positive")
        _check(self.let_go_tau_s > 0, "predictive.let_go_tau_s", "must be positive")
        _check(0 <= self.let_go_ratio < 1, "predictive.let_go_ratio", "must be in [0, 1) (0: never let go)")
        _check(0 < self.capacity_measure_fill <= 1, "predictive.capacity_measure_fill", "must be in (0, 1]")
        _check(0 <= self.fallback_fill <= 1, "predictive.fallback_fill", "must be in [0, 1]")
        _check(0 < self.target_utilisation <= 1, "predictive.target_utilisation", "must be in (0, 1]")
        _check(self.margin_z >= 0, "predictive.margin_z", "must be >= 0")
        _check(self.max_queue_per_instance >= 0, "predictive.max_queue_per_instance", "must be >= 0")
        _check(0 < self.fallback_step_fraction <= 1, "predictive.fallback_step_fraction",
               "must be in (0, 1]")


class StaticConfig(_Config):
    """A fixed pool: the baseline that every elastic policy is priced against."""

    instances: int = 1

    def _check_values(self) -> None:
        _check(self.instances >= 0, "static.instances", f"must be >= 0, got {self.instances}")


class AutoscaleConfig(_Config):
    """Everything a pool's scaling stack needs; ``policy`` names the one in charge."""

    policy: PolicyName = Field("predictive", description="the scaling policy")
    tick_s: float = Field(2.0, description="seconds between scaling decisions")
    slo: SLOConfig = SLOConfig()
    bounds: BoundsConfig = BoundsConfig()
    threshold: ThresholdConfig = ThresholdConfig()
    kpa: KPAConfig = KPAConfig()
    predictive: PredictiveConfig = PredictiveConfig()
    static: StaticConfig = StaticConfig()
    capacity: CapacityConfig = CapacityConfig()  # on-demand and spot
    # Cores the pool's instances share, each on its share (llmserve serve sets it for
    # local pools; 0: each instance's capacity is its own). See autoscale/shared_cores.py.
    shared_cores: Annotated[int, Flag(skip=True)] = Field(0, ge=0, description="cores the instances share")

    def _check_values(self) -> None:
        _check(self.policy in POLICY_NAMES, "policy", f"must be one of {POLICY_NAMES}, got {self.policy!r}")
        _check(self.tick_s > 0, "tick_s", f"must be positive, got {self.tick_s}")
        # A static pool bypasses the bounds (build.py), so a count over the maximum would run as given.
        _check(self.policy != "static" or self.static.instances <= self.bounds.max_instances, "static.instances",
               f"must be <= bounds.max_instances ({self.bounds.max_instances}), got {self.static.instances}")

