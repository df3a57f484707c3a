"""Assemble a pool's scaling stack from its config: the policy, wrapped in bounds."""

from __future__ import annotations

from llmserve.autoscale.bounds import BoundedPolicy
from llmserve.autoscale.config import AutoscaleConfig, BoundsConfig, StaticConfig
from llmserve.autoscale.kpa import KPAPolicy
from llmserve.autoscale.policy import ScalingPolicy
from llmserve.autoscale.predictive import PredictivePolicy
from llmserve.autoscale.shared_cores import CoreBoundPolicy
from llmserve.autoscale.static import StaticPolicy
from llmserve.autoscale.threshold import ThresholdPolicy


def build_inner_policy(config: AutoscaleConfig) -> ScalingPolicy:
    """The bare policy named by ``config.policy``, without bounds."""
    name = config.policy
    if name == "threshold":
        return ThresholdPolicy(config.threshold, config.slo)
    if name == "kpa":
        return KPAPolicy(config.kpa)
    if name == "predictive":
        return PredictivePolicy(config.predictive, config.slo)
    if name == "static":
        return StaticPolicy(config.static)
    raise ValueError(f"unknown scaling policy {name!r}")


def static_size(config: AutoscaleConfig) -> int:
    """Instances a static pool holds."""
    return max(config.static.instances, config.bounds.min_instances)


def build_policy(config: AutoscaleConfig) -> BoundedPolicy:
    """The full stack the controller and the simulator both run.

    A static pool bypasses the step caps and cooldowns (it is fixed by
    definition) and holds ``static.instances``, never fewer than
    ``bounds.min_instances`` (the floor every policy keeps); every other
    policy gets ``config.bounds``.
    """
    if config.policy == "static":
        n = static_size(config)
        inner = StaticPolicy(StaticConfig(instances=n))
        bounds = BoundsConfig(min_instances=n, max_instances=max(n, 1), scale_up_cooldown_s=0.0,
                              scale_down_window_s=0.0, max_step_up=max(n, 1), max_step_down=max(n, 1))
        return BoundedPolicy(inner, bounds)
    inner = build_inner_policy(config)
    if config.shared_cores:  # instances split one machine's cores: more must be measured to serve more
        inner = CoreBoundPolicy(inner, config.shared_cores)
    return BoundedPolicy(inner, config.bounds)
