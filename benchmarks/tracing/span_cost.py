"""CPU time of one request's telemetry, without servers: the figure a busy shared machine
distorts least (``time.process_time``, after a warm-up).

Per request, as the live code makes it: the gateway's spans (``RequestTrace``: root,
route, admission, one attempt), the instance's server span and the four engine span
records it exports (``InstanceTelemetry.begin`` and ``end``), the engine's records
themselves (``request_spans``), and the OTLP protobuf encoding of all nine spans that
the batch processor's thread does before sending (``llmserve.tracing.otlp_wire``; the
SDK's ``encode_spans`` beside it, for comparison).

    python benchmarks/tracing/span_cost.py [--requests 3000]

Results: ``benchmarks/results/tracing_span_cost.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from llmserve.engine.outputs import RequestMetrics  # noqa: E402
from llmserve.engine.request import Request  # noqa: E402
from llmserve.engine.sampling_params import SamplingParams  # noqa: E402
from llmserve.engine.trace_spans import request_spans  # noqa: E402
from llmserve.tracing.gateway import RequestTrace  # noqa: E402
from llmserve.tracing.instance import InstanceTelemetry  # noqa: E402
from llmserve.tracing.otlp_wire import OTLPTraceEncoder  # noqa: E402
from llmserve.tracing.provider import Tracing  # noqa: E402

CLIENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
BODY = {"model": "m", "prompt": "hi", "max_tokens": 64, "temperature": 0, "stream": True}


class Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list = []

    def export(self, spans) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def gateway_request(tr: Tracing) -> str:
    rt = RequestTrace(tr, CLIENT, BODY, "m", "rid", time.monotonic())
    rt.routed("v1", "weight", {"v1": 0.9, "v2": 0.1})
    rt.waited(0.0005, False, "realtime")
    headers: dict[str, str] = {}
    rt.attempt("127.0.0.1:8001", headers, 1, None)
    rt.finish(200, True, None, {"gen_ai.usage.output_tokens": 64, "llmserve.attempts": 1, "llmserve.ttft_ms": 20.0})
    return headers["traceparent"]


def engine_records(traceparent: str) -> list[list]:
    r = Request("r-0-0", list(range(128)), SamplingParams(max_tokens=64), 64, arrival_time=time.monotonic() - 0.3,
                trace=traceparent)
    r.all_token_ids += list(range(64))
    now = time.monotonic()
    return request_spans(r, "length", RequestMetrics(now - 0.3, now - 0.29, now - 0.25, now, now))


def instance_request(it: InstanceTelemetry, traceparent: str, records: list[list]) -> None:
    t0 = time.monotonic()
    tel = it.begin({"traceparent": traceparent})
    tel.arrival, tel.scheduled, tel.first_token, tel.finished = t0 - 0.3, t0 - 0.29, t0 - 0.25, t0
    tel.input_tokens, tel.output_tokens, tel.records = 128, 64, records
    it.end(tel, 200, t0, "rid", "text_completion", "/v1/completions")


def measure(n: int) -> dict:
    gw_out, inst_out = Keep(), Keep()
    gw = Tracing("g", gw_out)  # batched, as served (Keep.export is all the batch thread does)
    inst = InstanceTelemetry(None, Tracing("i", inst_out), False, lambda: "m")
    for _ in range(200):  # warm-up
        instance_request(inst, gateway_request(gw), engine_records(gateway_request(gw)))
    gw.processor.force_flush()
    inst.tracing.processor.force_flush()
    gw_out.spans.clear()
    inst_out.spans.clear()
    cpu: dict[str, float] = {"gateway": 0.0, "engine": 0.0, "instance": 0.0}
    for _ in range(n):
        c0 = time.process_time()
        tp = gateway_request(gw)
        c1 = time.process_time()
        recs = engine_records(tp)
        c2 = time.process_time()
        instance_request(inst, tp, recs)
        c3 = time.process_time()
        cpu["gateway"] += c1 - c0
        cpu["engine"] += c2 - c1
        cpu["instance"] += c3 - c2
    gw.processor.force_flush()
    inst.tracing.processor.force_flush()
    spans = gw_out.spans + inst_out.spans
    per = {k: 1e6 * v / n for k, v in cpu.items()}
    encoder = OTLPTraceEncoder()
    for name, encode in (("otlp_encode_sdk", lambda b: encode_spans(b).SerializeToString()),
                         ("otlp_encode", encoder.encode)):
        c0 = time.process_time()
        for k in range(0, len(spans), 512):  # the batch processor's default batch
            encode(spans[k:k + 512])
        per[name] = 1e6 * (time.process_time() - c0) / n
    per["total"] = sum(v for k, v in per.items() if k != "otlp_encode_sdk")
    return {"requests": n, "spans_per_request": len(spans) / n, "cpu_us_per_request": per}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    args = p.parse_args()
    import os

    out = measure(args.requests)
    out["loadavg"] = os.getloadavg()
    out["command"] = "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    results = ROOT / "benchmarks" / "results"
    (results / "tracing_span_cost.json").write_text(json.dumps(out, indent=1))
    per = out["cpu_us_per_request"]
    md = ["# CPU per request of its telemetry (tracing on)", "", f"`{out['command']}`", "",
          f"{args.requests} requests, {out['spans_per_request']:.0f} spans each; load average "
          f"{out['loadavg'][0]:.1f} on a shared 2-CPU machine (CPU time, not wall time).", "",
          "| where | CPU µs per request | on the request's path before its first token? |", "|---|---|---|",
          f"| gateway spans (root, route, admission, attempt) | {per['gateway']:.0f} "
          "| its trace context and times; the spans are made at its end |",
          f"| engine span records (engine process) | {per['engine']:.0f} | no: when it finishes |",
          f"| instance span + exporting the engine's records | {per['instance']:.0f} "
          "| its trace context; the span is made at its end |",
          f"| OTLP protobuf encoding (batch thread; `llmserve.tracing.otlp_wire`) | {per['otlp_encode']:.0f} "
          f"| no: in the background |",
          f"| (the same with the SDK's `encode_spans`, not used) | ({per['otlp_encode_sdk']:.0f}) | |",
          f"| **total** | **{per['total']:.0f}** | |", ""]
    (results / "tracing_span_cost.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
