"""A small fake OpenAI-compatible engine instance, and a uvicorn-in-a-thread helper.

Only the gateway is under test here: the fake streams tokens, reports its load on
``/load`` (or only ``/metrics``, like vLLM), and can inject faults (error
statuses, latency, a stream that breaks mid-way). Loopback addresses only.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from llmserve.ports import free_port


DEAD_EVENT = (b'data: {"error": {"message": "the engine failed", "type": "service_unavailable", '
              b'"param": null, "code": "engine_dead"}}\n\n')


@dataclass
class Behaviour:
    instance_id: str
    tokens: int = 4
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.0
    error_rate: float = 0.0
    error_status: int = 500
    error_code: str | None = None  # e.g. request_failed: the engine failed that request alone
    raw_answer: tuple[int, str, str] | None = None  # (status, content type, body): what a foreign server may say
    break_after_tokens: int | None = None
    # the engine-dead error event written in the same buffer as this many tokens' last one
    dead_after_tokens: int | None = None
    first_token_gate: threading.Event | None = None  # the first token waits for it
    has_load: bool = True
    has_ready: bool = True
    ready: bool = True
    max_num_seqs: int = 8
    report_waiting: int | None = None  # override what /load says
    report_running: int | None = None
    seed: int = 0
    # LoRA (vLLM's API): resident adapters (/load's lora_adapters); a request whose model is
    # neither "base_model" nor resident gets 404; /v1/load_lora_adapter answers load_status.
    adapters: set[str] = field(default_factory=set)
    base_model: str | None = None
    load_status: int = 200
    load_delay_s: float = 0.0
    adapter_loads: list[dict] = field(default_factory=list)
    report_adapters: set[str] | None = None  # override what /load says is resident
    models: dict | None = None  # what GET /v1/models answers (None: 404)
    models_delay_s: float = 0.0
    models_asked: int = 0
    models_headers: list[dict] = field(default_factory=list)  # of the /v1/models requests
    # observations
    requests: int = 0
    running: int = 0
    max_running: int = 0
    bodies: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


def _chunk(b: Behaviour, body: dict, text: str | None, finish: str | None, token: int | None = None) -> bytes:
    chat = "messages" in body
    if chat:
        choice = {"index": 0, "delta": {} if text is None else {"content": text},
                  "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
        obj = "text_completion"
    if body.get("return_token_ids"):  # like an llmserve engine: the chunk's ids, last
        choice["token_ids"] = [] if token is None else [token]
    data = {"id": "cmpl-1", "object": obj, "model": body.get("model"), "choices": [choice],
            "system_fingerprint": b.instance_id}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def make_app(b: Behaviour) -> Starlette:
    async def generate(request: Request) -> Response:
        body = await request.json()
        b.requests += 1
        b.bodies.append(body)
        b.headers.append(dict(request.headers))
        if b.base_model is not None and body.get("model") not in (b.base_model, *b.adapters):
            return JSONResponse({"error": {"message": f"model {body.get('model')!r} not found",
                                           "type": "not_found_error", "param": "model",
                                           "code": "model_not_found"}}, status_code=404)
        if b.raw_answer is not None:
            status, kind, text = b.raw_answer
            return Response(text, status_code=status, media_type=kind)
        if b.error_rate and b.rng.random() < b.error_rate:
            return JSONResponse({"error": {"message": f"injected fault on {b.instance_id}",
                                           "type": "server_error", "param": None,
                                           "code": b.error_code}}, status_code=b.error_status)
        b.running += 1
        b.max_running = max(b.max_running, b.running)
        if not body.get("stream"):
            try:
                await asyncio.sleep(b.first_token_delay_s + b.tokens * b.token_delay_s)
            finally:
                b.running -= 1
            text = " ".join(f"t{i}" for i in range(b.tokens))
            return JSONResponse({"id": "cmpl-1", "object": "chat.completion",
                                 "model": body.get("model"), "system_fingerprint": b.instance_id,
                                 "choices": [{"index": 0, "finish_reason": "length",
                                              "message": {"role": "assistant",
                                                          "content": text}}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": b.tokens,
                                           "total_tokens": 1 + b.tokens}})

        async def stream():
            try:
                await asyncio.sleep(b.first_token_delay_s)
                if b.first_token_gate is not None:
                    await asyncio.to_thread(b.first_token_gate.wait, 30)
                resumed = len(body.get("resume_token_ids") or [])  # (token i is "t{i} ", id i)
                for i in range(resumed, b.tokens):
                    if b.break_after_tokens is not None and i >= b.break_after_tokens and not resumed:
                        raise RuntimeError("injected mid-stream failure")
                    if b.dead_after_tokens is not None and i == b.dead_after_tokens - 1 and not resumed:
                        yield _chunk(b, body, f"t{i} ", None, i) + DEAD_EVENT
                        return
                    yield _chunk(b, body, f"t{i} ", None, i)
                    await asyncio.sleep(b.token_delay_s)
                yield _chunk(b, body, None, "length")
                yield b"data: [DONE]\n\n"
            finally:
                b.running -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def load(request: Request) -> Response:
        if not b.has_load:
            return PlainTextResponse("not found", status_code=404)
        return JSONResponse({
            "instance_id": b.instance_id, "model": "fake", "ready": b.ready, "draining": False,
            "num_running": b.running if b.report_running is None else b.report_running,
            "num_waiting": 0 if b.report_waiting is None else b.report_waiting,
            "num_waiting_by_priority": {}, "kv_cache_usage": 0.0, "busy_fraction": 0.0,
            "tokens_per_s": 0.0, "generation_tokens_per_s": 0.0,
            "max_num_seqs": b.max_num_seqs, "prefix_cache_hit_rate": 0.0,
            "timestamp": time.time(),
            "lora_adapters": sorted(b.adapters if b.report_adapters is None else b.report_adapters)})

    async def load_adapter(request: Request) -> Response:
        body = await request.json()
        b.adapter_loads.append(body)
        await asyncio.sleep(b.load_delay_s)
        if b.load_status != 200:
            return JSONResponse({"error": {"message": f"injected load failure on {b.instance_id}",
                                           "type": "invalid_request_error", "param": None, "code": None}},
                                status_code=b.load_status)
        if body["lora_name"] in b.adapters:
            return JSONResponse({"error": {"message": f"adapter {body['lora_name']!r} is already loaded",
                                           "type": "invalid_request_error", "param": "lora_name",
                                           "code": None}}, status_code=400)
        b.adapters.add(body["lora_name"])
        return PlainTextResponse("ok")

    async def metrics(request: Request) -> Response:
        running = b.running if b.report_running is None else b.report_running
        waiting = 0 if b.report_waiting is None else b.report_waiting
        return PlainTextResponse(
            f'vllm:num_requests_running{{model_name="fake"}} {running}\n'
            f'vllm:num_requests_waiting{{model_name="fake"}} {waiting}\n'
            f'vllm:kv_cache_usage_perc{{model_name="fake"}} 0.1\n')

    async def ready(request: Request) -> Response:
        if not b.has_ready:
            return PlainTextResponse("not found", status_code=404)
        return JSONResponse({"ready": b.ready}, status_code=200 if b.ready else 503)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        b.models_headers.append(dict(request.headers))
        b.models_asked += 1
        await asyncio.sleep(b.models_delay_s)
        if b.models is None:
            return PlainTextResponse("not found", status_code=404)
        return JSONResponse(b.models)

    return Starlette(routes=[
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/v1/load_lora_adapter", load_adapter, methods=["POST"]),
        Route("/load", load), Route("/metrics", metrics), Route("/ready", ready),
        Route("/health", health), Route("/v1/models", models)])


class ServerThread:
    """Serves an ASGI app with uvicorn on 127.0.0.1 in a background thread."""

    def __init__(self, app, port: int = 0, **uvicorn_options) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1, **uvicorn_options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self, force: bool = False) -> None:
        # Not uvicorn's force_exit: since uvicorn 0.3x it skips the lifespan shutdown, so
        # the app's own stop (background tasks, upstream pool) would never run. ``force``
        # only shortens the wait for open connections before they are cancelled.
        if force:
            self.server.config.timeout_graceful_shutdown = 0.2
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
