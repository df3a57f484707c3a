"""The instance server's own settings (the engine's are in ``EngineConfig``).

``priority_range``: the integer priorities a request may carry (body ``priority``
or ``x-priority``); outside it, 400. The instance trusts any priority inside it
from any key: it sits behind the gateway, which decides each client's priority
(``gateway/auth.py``) and sends only that. Widen it (``--priority-range -10 10``)
to match what the gateway's keys may send as integers.

The command line is generated from these fields (``llmserve/flags.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from llmserve.flags import Flag
from llmserve.http_guard import HttpLimits
from llmserve.priority import NAMED_RANGE, PriorityRange
from llmserve.server.reasoning_parser import REASONING_PARSERS
from llmserve.server.tool_formats import TOOL_CALL_PARSERS
from llmserve.tracing.config import TracingConfig


def _priority_range(bounds: list[int]) -> PriorityRange:
    return PriorityRange(*bounds)


class ServerConfig(HttpLimits):
    """The connection-level limits are :class:`HttpLimits`' fields (and flags), its defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8001, gt=0, lt=65536)
    api_keys: Annotated[list[str], Flag(name="--api-key", append=True)] = Field(
        default_factory=list, description="accepted API key (repeatable; LLMSERVE_API_KEY adds one)")
    admin_key: SecretStr | None = Field(None, description="key that loading and unloading LoRA adapters "
                                                          "needs (x-admin-key; unset: the API key's rule)")
    priority_range: Annotated[PriorityRange, Flag(nargs=2, type=int, parse=_priority_range,
                                                  metavar=("MIN", "MAX"))] = Field(
        NAMED_RANGE, description="integer priorities accepted, lower runs first (default 0 1: realtime, batch)")
    served_model_name: list[str] = Field(default_factory=list, description="names the model answers to")
    instance_id: str = ""
    max_queued_requests: int = Field(256, ge=1)
    max_queued_prompt_tokens: int = 1 << 20
    max_n: int = Field(16, ge=1)
    max_logprobs: int = 20
    max_tokens_limit: int | None = None
    max_batch_prompts: int = Field(64, ge=1)
    max_body_bytes: int = Field(4 << 20, ge=1)
    # Outputs a stream may have queued for a client that is not reading, per sequence,
    # before the request is aborted (each holds one step's delta: a token or a few).
    stream_buffer_outputs: int = Field(256, ge=1)
    drain_timeout_s: float = 30.0
    warmup: bool = Field(True, description="run a warm-up generation before answering /ready 200")
    # The engine core in its own process (llmserve.engine.core_proc); False: in a thread
    # of the server process (one GIL for HTTP and the engine loop).
    engine_process: Annotated[bool, Flag(name="--engine-in-thread", negate=True)] = Field(
        True, description="run the engine core in a thread of the server process, not its own process")
    # Fault injection, for canary and failover tests: a share of generation requests
    # answered 500, and latency added before each.
    fault_error_rate: float = Field(0.0, ge=0.0, le=1.0, description="testing: share of requests answered 500")
    fault_latency_ms: float = Field(0.0, description="testing: latency added to each request")
    fault_chunk_latency_ms: float = Field(0.0, description="testing: latency added before each streamed chunk "
                                                           "(keeps a stream in flight)")
    startup_delay_s: float = Field(0.0, description="seconds to wait before loading the model "
                                                    "(simulates a slow cold start)")
    log_level: str = "warning"
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP collector for traces, e.g. http://127.0.0.1:4318 "
                                                        "(default: OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing)")
    trace_sample_ratio: float = Field(1.0, ge=0.0, le=1.0, description="share of new traces recorded (a "
                                      "request with a traceparent follows its caller)")
    access_log: bool = Field(False, description="one JSON line per generation request on stderr")
    # The model's formats (docs/families.md); None: follow the model.
    chat_template: str | None = Field(None, description="chat template instead of the model's: a file, "
                                                        "or the Jinja text itself")
    tool_call_parser: Literal[TOOL_CALL_PARSERS] | None = Field(
        None, description="notation tool calls are read in (default: the one the chat template writes)")
    reasoning_parser: Literal[REASONING_PARSERS] | None = Field(
        None, description="return <think> reasoning as reasoning_content")
    generation_config: str = Field("auto", description="sampling defaults for what a request leaves out: "
                                   "auto (the model's generation_config.json), vllm (none), or a folder holding one")

    @model_validator(mode="after")
    def _tracing(self) -> "ServerConfig":
        self.tracing()  # validates the collector's URL
        return self

    @field_validator("chat_template")
    @classmethod
    def _template_found(cls, v: str | None) -> str | None:
        # As vLLM's load_chat_template: a value with no Jinja in it is a path, and a mistyped one
        # fails the start instead of becoming every chat's prompt text.
        if v is not None and not any(c in v for c in "{}\n") and not Path(v).is_file():
            raise ValueError(f"{v!r}: no such chat template file (a template given inline has Jinja in it)")
        return v

    @field_validator("generation_config")
    @classmethod
    def _generation_config(cls, v: str) -> str:
        if v not in ("auto", "vllm") and not (Path(v) / "generation_config.json").is_file():
            raise ValueError(f"{v!r}: auto, vllm, or a folder with a generation_config.json")
        return v

    def tracing(self) -> TracingConfig:
        return TracingConfig(otlp_endpoint=self.otlp_endpoint, service_name="llmserve-instance",
                             access_log=self.access_log, sample_ratio=self.trace_sample_ratio)

    def served_names(self, default: str) -> list[str]:
        return self.served_model_name or [default]
