"""A gateway and an instance (its engine core in a forked process) in one fresh Python
process, each with an in-memory span exporter; sends one streamed and one whole
request through them and writes what was exported as JSON.

Run by tests/tracing/test_trace_stack.py as ``python -m tests.tracing.traced_stack
MODEL_DIR OUT.json``: a process of its own, so it has one thread when the engine
process is forked (as ``llmserve engine`` has).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (before numpy: the fork needs one thread)

import asyncio  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

CLIENT_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def span_row(s) -> dict:
    return {"name": s.name, "trace_id": f"{s.context.trace_id:032x}", "span_id": f"{s.context.span_id:016x}",
            "parent_id": f"{s.parent.span_id:016x}" if s.parent else None, "kind": s.kind.name,
            "service": s.resource.attributes.get("service.name"), "pid": s.resource.attributes.get("process.pid"),
            "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.attributes.items()},
            "start": s.start_time, "end": s.end_time, "status": s.status.status_code.name}


async def _main(model: str, out_path: str) -> None:
    import httpx
    import uvicorn
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from llmserve.engine.config import EngineConfig
    from llmserve.engine import core_proc
    from llmserve.gateway.app import create_app as gateway_app
    from llmserve.gateway.config import GatewayConfig
    from llmserve.server.app import Instance, _engine_builder, create_app
    from llmserve.server.config import ServerConfig
    from llmserve.tracing.gateway import GatewayTelemetry
    from llmserve.tracing.provider import Tracing
    from tests.server.harness import free_port

    assert core_proc.can_fork(), "this process runs threads: the engine would not get its own process"
    iport, gport = free_port(), free_port()
    inst = Instance(ServerConfig(port=iport, served_model_name=["tiny"], access_log=True),
                    _engine_builder(EngineConfig(model=model, threads=1, max_num_seqs=4), True))
    inst_spans, gw_spans = InMemorySpanExporter(), InMemorySpanExporter()
    app = create_app(inst, Tracing("llmserve-instance", inst_spans, batch=False))
    gcfg = GatewayConfig.model_validate({
        "models": [{"name": "tiny", "versions": [{"name": "v1", "weight": 1.0, "upstreams": [f"http://127.0.0.1:{iport}"]}]}],
        "polling": {"load_interval_s": 0.05, "ready_interval_s": 0.1, "timeout_s": 1.0}})
    gapp = gateway_app(gcfg, GatewayTelemetry(Tracing("llmserve-gateway", gw_spans, batch=False), True))
    servers = [uvicorn.Server(uvicorn.Config(a, host="127.0.0.1", port=p, log_level="warning", lifespan=ls))
               for a, p, ls in ((app, iport, "off"), (gapp, gport, "on"))]
    tasks = [asyncio.create_task(s.serve()) for s in servers] + [asyncio.create_task(inst.start())]
    result: dict = {"api_pid": os.getpid()}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gport}", timeout=60) as c:
            for _ in range(600):
                if inst.state.value == "ready" and gapp.gateway.ready():
                    break
                await asyncio.sleep(0.1)
            result["engine_pid"] = inst.engine.handle.pid
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6,
                    "temperature": 0, "ignore_eos": True, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body,
                                headers={"traceparent": CLIENT_TRACEPARENT}) as r:
                result["stream_status"] = r.status_code
                result["stream_headers"] = dict(r.headers)
                result["stream_events"] = [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]
            r = await c.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4})
            result["whole_status"], result["whole_headers"] = r.status_code, dict(r.headers)
        await asyncio.sleep(0.2)  # the last spans end as the responses close
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        if inst.engine is not None:
            inst.engine.shutdown()
    result["spans"] = [span_row(s) for s in (*gw_spans.get_finished_spans(), *inst_spans.get_finished_spans())]
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
