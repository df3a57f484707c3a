"""The controller's record of one instance and its lifecycle timing.

Plain data: the controller (:mod:`llmserve.autoscale.controller`) is the only
code that changes a :class:`ManagedInstance`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, model_validator

from llmserve.autoscale.collector import CHARS_PER_TOKEN, LATENCY_WINDOW_S, OUTPUT_TOKENS_PRIOR, SIGNAL_WINDOW_S
from llmserve.autoscale.probe import Probe
from llmserve.autoscale.providers.base import InstanceHandle
from llmserve.lifecycle import InstanceState
from llmserve.load_report import LoadReport


class ControllerConfig(BaseModel):
    """Lifecycle timing; the scaling policy's own settings are in ``AutoscaleConfig``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    probe_interval_s: float = 0.5
    # Ready instances are asked too (less often): a process can outlive its engine.
    ready_probe_interval_s: float = 2.0
    probe_timeout_s: float = 2.0
    start_timeout_s: float = 600.0
    drain_timeout_s: float = 120.0
    stop_grace_s: float = 30.0
    unready_grace_s: float = 20.0
    restart_backoff_s: float = 2.0
    max_restart_backoff_s: float = 120.0
    # Instances in a row that fail before getting ready, none serving, before the pool gives
    # up starting them (start_failures.py; Ray Serve's DEPLOY_FAILED). 0: retry forever.
    max_start_failures: int = 3
    signal_window_s: float = SIGNAL_WINDOW_S
    latency_window_s: float = LATENCY_WINDOW_S
    chars_per_token: float = CHARS_PER_TOKEN
    output_tokens_prior: float = OUTPUT_TOKENS_PRIOR

    @model_validator(mode="after")
    def _checked(self) -> ControllerConfig:
        for name in ("probe_interval_s", "ready_probe_interval_s", "probe_timeout_s", "start_timeout_s", "stop_grace_s",
                     "signal_window_s", "latency_window_s", "chars_per_token", "output_tokens_prior"):
            if not getattr(self, name) > 0:
                raise ValueError(f"controller config: {name} must be positive, got {getattr(self, name)}")
        for name in ("drain_timeout_s", "unready_grace_s", "restart_backoff_s", "max_restart_backoff_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"controller config: {name} must be >= 0, got {getattr(self, name)}")
        if self.max_start_failures < 0:
            raise ValueError(f"controller config: max_start_failures must be >= 0 (0: never give up), "
                             f"got {self.max_start_failures}")
        return self


@dataclass(eq=False, slots=True)
class ManagedInstance:
    """The controller's record of one instance (monotonic times unless named ``*_wall``)."""

    id: str
    state: InstanceState
    created: float
    created_wall: float
    since: float
    reason: str = ""
    handle: InstanceHandle | None = None
    in_pool: bool = False
    ready_at: float | None = None
    drain_started: float | None = None  # None: not drained (never, or revived since)
    unready_since: float | None = None
    exit_code: int | None = None
    replaces: str | None = None
    last_probe: Probe | None = None
    probed_at: float | None = None
    last_load: LoadReport | None = None
    capacity_class: str = "on_demand"  # or "spot" (capacity_classes.py)
    reclaim_at: float | None = None  # unix time the provider takes it (a reclaim notice)
    served: int = 0  # requests the gateway routed to it, kept once it leaves the pool
