"""Test doubles for the bench: a fake OpenAI-compatible server and a tiny real tokenizer.

The fake server streams like vLLM's (one choice event per token, a usage event,
``[DONE]``) and counts what it served, so tests can check the bench's numbers
against the server's. Path prefixes select failure behaviours:
``/ok/v1``, ``/http500/v1``, ``/drop/v1`` (connection dropped mid-stream),
``/hang/v1`` (never answers), ``/nodone/v1`` (stream ends without [DONE]),
``/mixed/v1`` (every other request answers 503), ``/warming/v1`` (the first two
requests answer 503, as a server warming up does).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class ServerStats:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    success: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict] = field(default_factory=list)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)  # prompt -> (start, end)


def make_fake_openai_app(stats: ServerStats, token_delay_s: float = 0.002, tokens_per_chunk: int = 1) -> Starlette:
    """Prompt tokens are whitespace words; the answer is ``max_tokens`` tokens (or 3 unless ignore_eos)."""

    async def handle(request: Request) -> Response:
        mode = request.path_params.get("mode", "ok")  # /v1/...: the plain server
        body = await request.json()
        stats.requests += 1
        stats.bodies.append(body)
        if mode == "warming" and stats.requests <= 2:
            return JSONResponse({"error": {"message": "the instance is not ready (warming)"}}, status_code=503)
        if mode == "http500" or (mode == "mixed" and stats.requests % 2 == 0):
            return JSONResponse({"error": {"message": "boom"}}, status_code=500 if mode == "http500" else 503)
        if mode == "hang":
            await asyncio.sleep(30)
        chat = request.url.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n_prompt = len(prompt.split()) if not chat else sum(len(m["content"].split()) for m in body["messages"])
        n_out = body["max_tokens"] if body.get("ignore_eos") else min(3, body["max_tokens"])

        async def events():
            stats.in_flight += 1
            stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
            start = time.perf_counter()
            try:
                if chat:
                    yield _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                sent = 0
                while sent < n_out:
                    await asyncio.sleep(token_delay_s)
                    k = min(tokens_per_chunk, n_out - sent)
                    sent += k
                    if mode == "drop" and sent > 1:
                        raise ConnectionError("dropping the connection mid-stream")
                    text = " tok" * k
                    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                    yield _sse({"choices": [choice]})
                yield _sse({"choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                                     "total_tokens": n_prompt + n_out}})
                if mode != "nodone":
                    yield "data: [DONE]\n\n"
                stats.success += 1
                stats.prompt_tokens += n_prompt
                stats.completion_tokens += n_out
            finally:
                stats.in_flight -= 1
                stats.spans[prompt] = (start, time.perf_counter())

        return StreamingResponse(events(), media_type="text/event-stream")

    async def prometheus(request: Request) -> Response:
        lines = [
            "# TYPE vllm:request_success counter",
            f'vllm:request_success_total{{finished_reason="length",model_name="fake-model"}} {stats.success}',
            'vllm:request_success_total{finished_reason="stop",model_name="fake-model"} 0.0',
            'vllm:request_success_created{finished_reason="length",model_name="fake-model"} 1.7e9',
            f'vllm:prompt_tokens_total{{model_name="fake-model"}} {float(stats.prompt_tokens)}',
            f'vllm:generation_tokens_total{{model_name="fake-model"}} {float(stats.completion_tokens)}',
            "vllm:num_requests_running 0",
        ]
        return Response("\n".join(lines) + "\n", media_type="text/plain")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    return Starlette(routes=[
        Route("/{mode}/v1/completions", handle, methods=["POST"]),
        Route("/{mode}/v1/chat/completions", handle, methods=["POST"]),
        Route("/{mode}/v1/models", models, methods=["GET"]),
        Route("/{mode}/metrics", prometheus, methods=["GET"]),
        Route("/v1/completions", handle, methods=["POST"]),
        Route("/v1/chat/completions", handle, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ])


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class ServerThread:
    """Runs an ASGI app with uvicorn on a free 127.0.0.1 port in a daemon thread."""

    def __init__(self, app) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="critical", lifespan="off", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


CORPUS_WORDS = (
    "river stone light music garden window table bridge market winter summer forest letter paper "
    "morning reason research teacher history office health person family student country problem "
    "the a of and to in is it that was for on are with as his they be at one have this from"
).split()


def build_tiny_tokenizer(directory: Path) -> Path:
    """Train a small byte-level BPE (GPT-2 style) and save it as a Hugging Face folder.

    Byte-level BPE is the hard case for exact lengths: the first word has no leading
    space and so splits differently, and merges cross characters freely.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = [" ".join(CORPUS_WORDS[i:] + CORPUS_WORDS[:i]) for i in range(len(CORPUS_WORDS))]
    tok.train_from_iterator(lines * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    return directory
