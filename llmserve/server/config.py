"""The instance server's own settings (the engine's are in ``EngineConfig``).

``priority_range``: the integer priorities a request may carry (body ``priority``
or ``x-priority``); outside it, 400. The instance trusts any priority inside it
from any key: it sits behind the gateway, which decides each client's priority
(``gateway/auth.py``) and sends only that. Widen it (``--priority-range -10 10``)
to match what the gateway's keys may send as integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmserve.priority import NAMED_RANGE, PriorityRange


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8001
    api_keys: list[str] = field(default_factory=list)
    priority_range: PriorityRange = NAMED_RANGE  # realtime (0) and batch (1) only
    served_model_name: list[str] = field(default_factory=list)
    instance_id: str = ""
    max_queued_requests: int = 256
    max_queued_prompt_tokens: int = 1 << 20
    max_n: int = 16
    max_logprobs: int = 20
    max_tokens_limit: int | None = None
    max_batch_prompts: int = 64
    max_body_bytes: int = 4 << 20
    max_header_bytes: int = 16 << 10
    drain_timeout_s: float = 30.0
    warmup: bool = True
    # Fault injection, for canary and failover tests: a share of generation requests
    # answered 500, and latency added before each.
    fault_error_rate: float = 0.0
    fault_latency_ms: float = 0.0
    # Seconds to wait before loading the model: stands in for a slow cold start.
    startup_delay_s: float = 0.0
    log_level: str = "warning"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError("port must be in 1..65535")
        for name in ("max_queued_requests", "max_n", "max_batch_prompts", "max_body_bytes", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0.0 <= self.fault_error_rate <= 1.0:
            raise ValueError("fault_error_rate must be in [0, 1]")

    def served_names(self, default: str) -> list[str]:
        return self.served_model_name or [default]
