"""One engine instance as an HTTP service: assembles the routes, lifecycle and drain.

Lifecycle: the HTTP port opens at once (so a controller can watch ``/health``);
weights load in a thread, a warm-up generation runs, then ``/ready`` turns 200.
The first SIGTERM drains (``/ready`` 503, new requests 503, in-flight ones
finish up to ``drain_timeout_s``) and the process exits 0; a second exits at once.
An engine that dies while serving (its loop crashed, or a forward pass failed for
the whole batch) fails the instance: ``/ready`` and ``/health`` answer 503 and
``/load`` says not ready, so the gateway stops routing to it and the controller
replaces it. The process stays up to say why. ``/ready``, ``/health`` and ``/load``
say which state it is in with the shared lifecycle words (:mod:`llmserve.lifecycle`):
starting, warming, ready, draining, failed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmserve.engine.client import EngineClient, EngineStart
from llmserve.engine.config import EngineConfig
from llmserve.engine.in_thread import InThreadEngine
from llmserve.engine.multi_process import MultiProcessEngine
from llmserve.engine.stats import WARMUP_ID_PREFIX
from llmserve.engine.sampling_params import SamplingParams
from llmserve.http_guard import uvicorn_options
from llmserve.lifecycle import InstanceState
from llmserve.load_report import LoadReport
from llmserve.models.errors import FlagError
from llmserve.models.loader import ModelLoadError
from llmserve.server.config import ServerConfig
from llmserve.server.guards import ApiKeyAuth, BodyLimit
from llmserve.server.lora_api import add_lora_routes
from llmserve.server.metrics import EngineMetrics
from llmserve.server.models_api import add_model_routes
from llmserve.api.errors import APIError, error_body
from llmserve.api.frontends import Frontends, keys_authorizer
from llmserve.api.response_store import SQLiteResponseStore
from llmserve.api.parse import parse_model
from llmserve.api.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ThreadsRequest,
                                   TokenizeRequest)
from llmserve.server.serving import OpenAIServing
from llmserve.tracing.start import start_tracing
from llmserve.tracing.instance import InstanceTelemetry

if TYPE_CHECKING:
    from llmserve.tracing.provider import Tracing

log = logging.getLogger("llmserve.server")

# The warm-up batch: a few rows of a short prompt and a few decode steps.
WARMUP_ROWS, WARMUP_PROMPT, WARMUP_OUTPUT = 4, 32, 8
S = InstanceState


class Instance:
    """Holds the engine once loaded and the instance's lifecycle state."""

    def __init__(self, config: ServerConfig, build: EngineStart) -> None:
        self.config = config
        self.build = build
        self.state = S.STARTING
        self.error: str | None = None
        self.load_error: Exception | None = None  # why the engine did not start
        self.engine: EngineClient | None = None
        self.serving: OpenAIServing | None = None
        self.metrics: EngineMetrics | None = None
        self.model_name = ""
        self.instance_id = config.instance_id or uuid.uuid4().hex[:12]
        self.started = time.monotonic()
        self.ready_after_s: float | None = None
        self.drain_started: float | None = None

    async def start(self) -> None:
        if self.config.startup_delay_s:
            await asyncio.sleep(self.config.startup_delay_s)
        try:
            self.engine = await self.build()
        except Exception as e:  # noqa: BLE001 - reported on /health and in the log
            self.state, self.error, self.load_error = S.FAILED, str(e), e
            if not isinstance(e, (ModelLoadError, FlagError)):  # (their one line is the CLI's: run_server)
                log.error("model load failed: %s", e)
            return
        self.model_name = (self.config.served_model_name or [self.engine.model_name])[0]
        self.serving = OpenAIServing(self.engine, self.config, self.model_name)
        self.metrics = EngineMetrics(self.engine, self.model_name)
        self.state = S.WARMING
        if self.config.warmup:
            try:
                # Grammar info now, in a thread: no structured-output request builds it on the loop.
                await asyncio.to_thread(self.engine.warm_grammar)
                await self._warm_up()
            except Exception as e:  # noqa: BLE001
                log.error("warm-up failed: %s", e)
                self.state, self.error = S.FAILED, f"warm-up failed: {e}"
                return
        if self.state is S.WARMING:
            self.state = S.READY
            self.ready_after_s = time.monotonic() - self.started
            log.warning("instance %s ready in %.2f s (model %s)", self.instance_id, self.ready_after_s,
                        self.model_name)

    async def _warm_up(self) -> None:
        """A small batch through the whole engine: the first real request pays no lazy start,
        and the engine's step model (``/load``'s ``step_costs``, the autoscaler's capacity) is
        fitted to this instance's own steps, prefill and decode, before it takes traffic."""
        eng = self.engine
        rows = max(1, min(WARMUP_ROWS, eng.load_snapshot().get("max_num_seqs", 1) or 1))
        n = max(1, min(WARMUP_PROMPT, eng.max_model_len // 2 - WARMUP_OUTPUT))
        top = max(2, eng.vocab_size - 1)
        sp = SamplingParams(max_tokens=WARMUP_OUTPUT, temperature=0, ignore_eos=True)

        async def one(i: int) -> None:  # distinct prompts: no prefix-cache hit between them
            async for _ in eng.add_request([1 + (i * 31 + j) % top for j in range(n)], sp,
                                           request_id=f"{WARMUP_ID_PREFIX}{i}"):
                pass

        await asyncio.gather(*(one(i) for i in range(rows)))

    def check_engine(self) -> InstanceState:
        """The state, failed first if the engine died since the last look."""
        eng = self.engine
        if eng is not None and self.state in (S.WARMING, S.READY, S.DRAINING) and not eng.is_alive():
            self.state, self.error = S.FAILED, eng.death or "the engine loop stopped"
            log.error("instance %s failed: %s", self.instance_id, self.error)
        return self.state

    def need_serving(self) -> OpenAIServing:
        self.check_engine()
        if self.state is S.DRAINING:
            raise APIError(503, "the server is draining; retry on another instance", "service_unavailable",
                           headers={"Retry-After": "1"})
        if self.serving is None or self.state is not S.READY:
            raise APIError(503, f"the instance is not ready ({self.state.value})", "service_unavailable",
                           headers={"Retry-After": "1"})
        return self.serving

    def load_report(self) -> dict[str, Any]:
        self.check_engine()
        snap: dict[str, Any] = {}
        if self.engine is not None:
            snap = self.engine.load_snapshot()
        q, h = snap.get("prefix_cache_queries", 0), snap.get("prefix_cache_hits", 0)
        return LoadReport(
            instance_id=self.instance_id, model=self.model_name, state=self.state,
            ready=self.state is S.READY, draining=self.state is S.DRAINING, num_running=snap.get("num_running", 0),
            num_waiting=snap.get("num_waiting", 0),
            num_waiting_by_priority=snap.get("num_waiting_by_priority", {}),
            kv_cache_usage=min(1.0, snap.get("kv_cache_usage", 0.0)),
            busy_fraction=snap.get("busy_fraction", 0.0), tokens_per_s=snap.get("tokens_per_s", 0.0),
            generation_tokens_per_s=snap.get("generation_tokens_per_s", 0.0),
            max_num_seqs=snap.get("max_num_seqs", 0), prefix_cache_hit_rate=(h / q) if q else 0.0,
            timestamp=time.time(), step_costs=snap.get("step_costs"), threads=snap.get("threads"),
            lora_adapters=snap.get("lora_adapters", []), lora_adapters_loaded=snap.get("lora_adapters_loaded", []),
            lora_adapters_registered=snap.get("lora_adapters_registered", [])
        ).model_dump()


def create_app(inst: Instance, tracing: Tracing | None = None) -> FastAPI:
    app = FastAPI(title="llmserve engine instance", docs_url=None, redoc_url=None)
    cfg = inst.config

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body("malformed JSON in the request body"), status_code=400)
        loc = [str(x) for x in first.get("loc", []) if x != "body"]
        msg = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"
        return JSONResponse(error_body(msg, param=loc[0] if loc else None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        detail = str(e.detail)
        if isinstance(e.__cause__, ValueError):  # e.g. an integer past int()'s 4300 digits
            detail = f"{detail}: {e.__cause__}"
        return JSONResponse(error_body(detail, kind), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception):
        log.exception("unexpected error")
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"), status_code=500)

    # HEAD too: a load balancer's check may send it (as the gateway's /health and /ready).
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        alive = inst.check_engine() is not S.FAILED
        body = {"status": "ok" if alive else "dead", "state": inst.state.value, "error": inst.error}
        return JSONResponse(body, status_code=200 if alive else 503)

    @app.api_route("/ready", methods=["GET", "HEAD"])
    async def ready():
        ok = inst.check_engine() is S.READY
        return JSONResponse({"ready": ok, "state": inst.state.value, "ready_after_s": inst.ready_after_s,
                             "error": inst.error, "instance_id": inst.instance_id},
                            status_code=200 if ok else 503)

    @app.get("/load")
    async def load():
        return inst.load_report()

    @app.post("/engine/threads")
    async def threads(request: Request):
        """``{"threads": n}``: the engine's torch threads from its next step (``llmserve serve``
        shares the machine's cores out over the instances running)."""
        body = parse_model(await request.body(), ThreadsRequest)
        if inst.engine is None:
            raise APIError(503, f"the instance is not running an engine ({inst.state.value})", "service_unavailable")
        inst.engine.set_threads(body.threads)
        return {"threads": body.threads}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if inst.metrics is None:
            return PlainTextResponse("", media_type=CONTENT_TYPE_LATEST)
        return PlainTextResponse(generate_latest(inst.metrics.registry).decode(), media_type=CONTENT_TYPE_LATEST)

    add_model_routes(app, inst)
    add_lora_routes(app, inst)

    # Bodies are parsed by llmserve.api (the gateway's parser too), not by FastAPI:
    # nesting, huge integers, NaN and lone surrogates become 400s, never 500s.
    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_model(await request.body(), CompletionRequest)
        return await inst.need_serving().completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = parse_model(await request.body(), ChatCompletionRequest)
        return await inst.need_serving().chat(body, request)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = parse_model(await request.body(), TokenizeRequest)
        s = inst.need_serving()
        s.check_model(body.model)
        if body.messages is not None:
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            ids = s.encode_chat(body.messages, body.add_generation_prompt, tools, body.chat_template_kwargs,
                                body.continue_final_message)
            if body.add_special_tokens:  # vLLM's: the tokenizer's own (BOS) on top of the template's
                ids = s.tokenizer.with_special_tokens(ids)
        elif body.prompt is not None:
            ids = s.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
        else:
            raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
        strs = s.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": s.engine.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = parse_model(await request.body(), DetokenizeRequest)
        s = inst.need_serving()
        s.check_model(body.model)
        vocab = s.engine.vocab_size
        if any(t >= vocab for t in body.tokens):
            raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
        return {"prompt": s.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    guarded = ApiKeyAuth(BodyLimit(app, cfg.max_body_bytes), cfg.api_keys)
    # /v1/responses and /v1/messages, translated onto the chat route above (llmserve/api/frontends.py)
    fronts = Frontends(guarded, SQLiteResponseStore(max_records=10_000), keys_authorizer(cfg.api_keys),
                       cfg.max_body_bytes)
    return InstanceTelemetry(fronts, tracing, cfg.access_log,  # type: ignore[return-value]
                             lambda: inst.model_name)


class _DrainingServer(uvicorn.Server):
    """uvicorn with drain-on-SIGTERM: finish in-flight work, then exit 0."""

    def __init__(self, config: uvicorn.Config, inst: Instance) -> None:
        super().__init__(config)
        self.inst = inst

    def handle_exit(self, sig, frame) -> None:  # noqa: ANN001 - signal handler signature
        inst = self.inst
        if inst.state is S.DRAINING or inst.state is S.FAILED or inst.serving is None:
            if inst.state is S.DRAINING:
                os._exit(1)  # second signal: stop now
            return super().handle_exit(sig, frame)
        log.warning("draining: %d requests in flight", inst.serving.in_flight)
        inst.state = S.DRAINING
        inst.serving.draining = True
        inst.drain_started = time.monotonic()

    async def on_tick(self, counter: int) -> bool:
        inst = self.inst
        inst.check_engine()
        if inst.state is S.FAILED and (inst.engine is None or inst.drain_started is not None):
            self.exit_code = 1  # (a failed engine with no drain asked for stays up to say why)
            return True
        if inst.state is S.DRAINING and inst.serving is not None:
            waited = time.monotonic() - (inst.drain_started or 0)
            if inst.serving.in_flight == 0 or waited > inst.config.drain_timeout_s:
                return True
        return await super().on_tick(counter)


def run_server(engine_config: EngineConfig, server_config: ServerConfig, sock: socket.socket | None = None) -> int:
    """Serve until drained; returns the process exit code. ``sock``: the listening socket,
    bound already (default: uvicorn binds the configured host and port)."""
    _refuse_unsupported(engine_config)
    logging.basicConfig(level=getattr(logging, server_config.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    inst = Instance(server_config, _engine_builder(engine_config, server_config.engine_process))
    tracing = start_tracing(server_config.tracing())  # after the fork: its export thread stays here
    app = create_app(inst, tracing)

    async def main() -> int:
        ucfg = uvicorn.Config(app, host=server_config.host, port=server_config.port,
                              **uvicorn_options(server_config.http_limits()),
                              log_level=server_config.log_level, access_log=False, lifespan="off",
                              timeout_graceful_shutdown=5)
        server = _DrainingServer(ucfg, inst)
        server.exit_code = 0  # type: ignore[attr-defined]
        loader = asyncio.create_task(inst.start())
        await server.serve(sockets=[sock] if sock is not None else None)
        loader.cancel()
        if inst.engine is not None:
            inst.engine.shutdown()
        if tracing is not None:
            tracing.shutdown()
        if isinstance(inst.load_error, (ModelLoadError, FlagError)):  # one line, exit 2 (run_command)
            raise inst.load_error
        return 1 if inst.state is S.FAILED else server.exit_code  # type: ignore[attr-defined]

    return asyncio.run(main())


def _refuse_unsupported(engine_config: EngineConfig) -> None:
    """A model of an unsupported family, or a --max-model-len past its context (refused as vLLM
    does), stops the start here in one line (the CLI prints it), not in the engine process."""
    from llmserve.models.model_source import refuse_unsupported
    from llmserve.models.store import locate

    try:
        source, _ = locate(engine_config.model, engine_config.model_store)
    except Exception:  # noqa: BLE001 - not found, not pulled: the engine's load reports it as before
        return
    config, asked = refuse_unsupported(source), engine_config.max_model_len
    if config is not None and asked and asked > config.max_position_embeddings:
        raise ValueError(f"--max-model-len: {asked} is longer than the model's context "  # (the engine's words)
                         f"({config.max_position_embeddings} tokens)")


def _engine_builder(engine_config: EngineConfig, own_process: bool) -> EngineStart:
    """The engine process is forked here, before the event loop starts any thread;
    in-thread when asked, or when this process already runs threads (fork unsafe)."""
    from llmserve.engine import core_proc
    from llmserve.engine.llm import build_engine, load_engine_tokenizer

    if not own_process:
        return lambda: InThreadEngine.start(lambda: build_engine(engine_config))
    if not core_proc.can_fork():
        log.warning("this process runs threads: the engine runs in a thread, not its own process")
        return lambda: InThreadEngine.start(lambda: build_engine(engine_config))
    try:
        tokenizer = load_engine_tokenizer(engine_config)  # before the fork: both sides share it
    except Exception as e:  # noqa: BLE001 - reported as the load failure, as in-thread
        err = e

        async def fail() -> EngineClient:
            raise err
        return fail
    handle = core_proc.start(lambda: build_engine(engine_config, tokenizer),
                             core_proc.new_ipc_dir())
    return lambda: MultiProcessEngine(handle, tokenizer).connect()
