"""Elastic scaling: signals, pure policies, the bounds around them, forecasting.

The live controller and the capacity simulator both build their stack with
:func:`build_policy`, so they make the very same decisions.
"""

from llmserve.autoscale.bounds import BoundedPolicy, BoundedState
from llmserve.autoscale.build import build_inner_policy, build_policy
from llmserve.autoscale.config import (
    AutoscaleConfig,
    BoundsConfig,
    KPAConfig,
    PredictiveConfig,
    SLOConfig,
    StaticConfig,
    ThresholdConfig,
)
from llmserve.autoscale.policy import Decision, ScalingPolicy
from llmserve.autoscale.signals import PoolSignals

__all__ = [
    "AutoscaleConfig", "BoundedPolicy", "BoundedState", "BoundsConfig", "Decision", "KPAConfig",
    "PoolSignals", "PredictiveConfig", "SLOConfig", "ScalingPolicy", "StaticConfig",
    "ThresholdConfig", "build_inner_policy", "build_policy",
]
