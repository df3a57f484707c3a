"""A minimal OTLP/HTTP trace receiver for tests: decodes each export with opentelemetry-proto."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)


class Receiver:
    """``spans``: one dict per received span (service, name, ids in hex, parent, attributes)."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[dict] = []
        self.posts: list[str] = []  # request paths
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                req = ExportTraceServiceRequest.FromString(body)
                receiver._add(self.path, req)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _add(self, path: str, req: ExportTraceServiceRequest) -> None:
        rows = []
        for rs in req.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    rows.append({"service": res.get("service.name"), "pid": res.get("process.pid"), "name": s.name,
                                 "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                 "parent_id": s.parent_span_id.hex() or None,
                                 "attributes": {a.key: _value(a.value) for a in s.attributes}})
        with self._lock:
            self.posts.append(path)
            self.spans += rows

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None
