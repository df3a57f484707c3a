"""Start the process's tracer from its settings (apart from them: the provider reads them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmserve.tracing.config import TracingConfig

if TYPE_CHECKING:
    from llmserve.tracing.provider import Tracing


def start_tracing(config: TracingConfig) -> Tracing | None:
    """The process's tracer when tracing is on; OpenTelemetry is not even imported otherwise."""
    if not config.enabled:
        return None
    from llmserve.tracing.provider import Tracing

    return Tracing.start(config)
