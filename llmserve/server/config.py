"""The instance server's own settings (the engine's are in ``EngineConfig``).

``priority_range``: the integer priorities a request may carry (body ``priority``
or ``x-priority``); outside it, 400. The instance trusts any priority inside it
from any key: it sits behind the gateway, which decides each client's priority
(``gateway/auth.py``) and sends only that. Widen it (``--priority-range -10 10``)
to match what the gateway's keys may send as integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmserve.http_guard import HttpLimits
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
    # Connection-level limits (see llmserve/http_guard.py). The gateway forwards a few
    # small headers, so 16 KiB is far above any legitimate request's headers.
    max_header_bytes: int = 16 << 10
    max_url_bytes: int = 8 << 10  # the API's paths are short; nginx's default line cap
    # A client (the gateway, over a local network) sends each head and body in one go:
    # seconds are already generous; a 4 MiB body at 30 s needs only ~140 KB/s.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # A client that reads nothing for this long is dropped (nginx's send_timeout is 60 s).
    send_timeout_s: float = 30.0
    # Above the gateway's upstream keep-alive expiry (4 s), so it never reuses a
    # connection the instance is closing.
    keep_alive_timeout_s: float = 5.0
    # Open connections: the gateway's pool plus direct clients, with room above the
    # request queue (max_queued_requests) and the running batch.
    max_connections: int = 1024
    # Outputs a stream may have queued for a client that is not reading, per sequence,
    # before the request is aborted (each holds one step's delta: a token or a few).
    stream_buffer_outputs: int = 256
    drain_timeout_s: float = 30.0
    warmup: bool = True
    # The engine core in its own process (llmserve.engine.core_proc); False: in a thread
    # of the server process (one GIL for HTTP and the engine loop).
    engine_process: bool = True
    # Fault injection, for canary and failover tests: a share of generation requests
    # answered 500, and latency added before each.
    fault_error_rate: float = 0.0
    fault_latency_ms: float = 0.0
    fault_chunk_latency_ms: float = 0.0  # before each streamed chunk: keeps a stream in flight
    # Seconds to wait before loading the model: stands in for a slow cold start.
    startup_delay_s: float = 0.0
    log_level: str = "warning"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError("port must be in 1..65535")
        for name in ("max_queued_requests", "max_n", "max_batch_prompts", "max_body_bytes",
                     "stream_buffer_outputs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        self.http_limits()  # validates the connection limits
        if not 0.0 <= self.fault_error_rate <= 1.0:
            raise ValueError("fault_error_rate must be in [0, 1]")

    def http_limits(self) -> HttpLimits:
        return HttpLimits(max_header_bytes=self.max_header_bytes, max_url_bytes=self.max_url_bytes,
                          header_timeout_s=self.header_timeout_s, body_timeout_s=self.body_timeout_s,
                          send_timeout_s=self.send_timeout_s, keep_alive_timeout_s=self.keep_alive_timeout_s,
                          max_connections=self.max_connections)

    def served_names(self, default: str) -> list[str]:
        return self.served_model_name or [default]
