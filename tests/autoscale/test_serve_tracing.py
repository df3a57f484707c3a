"""``llmserve serve --otlp-endpoint --access-log``: what each instance it starts is given."""

from __future__ import annotations


def test_serve_hands_its_collector_and_access_log_to_every_llmserve_instance():
    from llmserve.autoscale.providers.base import InstanceSpec
    from llmserve.serve.serve import traced_specs
    from llmserve.tracing.config import TracingConfig

    def specs(iid: str) -> InstanceSpec:
        return InstanceSpec(iid, ("--model", "m"), env=(("LLMSERVE_API_KEY", "k"),))

    on = traced_specs(specs, TracingConfig(otlp_endpoint="http://collector:4318", access_log=True))("v1-1")
    assert dict(on.env) == {"LLMSERVE_API_KEY": "k", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert on.engine_args == ("--model", "m", "--access-log")
    assert traced_specs(specs, TracingConfig())("v1-1") == specs("v1-1")
    foreign = traced_specs(lambda iid: InstanceSpec(iid, command=("vllm", "serve")), TracingConfig(access_log=True))
    assert "--access-log" not in foreign("v1-1").engine_args  # a foreign server has no such flag
