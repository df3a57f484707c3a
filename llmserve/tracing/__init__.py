"""Observability of one request across processes: OpenTelemetry traces, per-request
timings (``Server-Timing``) and JSON access-log lines.

Off unless configured (``--otlp-endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``, read once
by the CLI into :class:`~llmserve.tracing.config.TracingConfig`). The request path only
calls small hooks; everything OpenTelemetry is in this package. See docs/observability.md.
"""
