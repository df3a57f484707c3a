"""A stand-in foreign OpenAI-compatible server for tests: no torch, no model.

``python -m tests.autoscale.standin_server --port {port} --model NAME`` answers
``POST /v1/completions`` with a fixed completion, ``GET /health`` (200 once
"loaded", after ``--startup-delay``), and ``GET /metrics`` in vLLM's metric names.
It has no ``/ready`` and no ``/load``, like vLLM, so whoever drives it must use the
foreign-server paths. SIGTERM: uvicorn finishes in-flight requests and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse


def make_app(model: str, startup_delay_s: float, latency_s: float) -> FastAPI:
    app = FastAPI()
    started = time.monotonic()
    state = {"running": 0, "generated": 0, "prompt": 0}

    @app.get("/health")
    async def health():
        if time.monotonic() - started < startup_delay_s:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if body.get("model") != model:
            return JSONResponse({"error": {"message": f"model {body.get('model')!r} not served"}}, status_code=404)
        state["running"] += 1
        try:
            await asyncio.sleep(latency_s)
        finally:
            state["running"] -= 1
        n = int(body.get("max_tokens") or 4)
        state["generated"] += n
        state["prompt"] += 3
        return {"id": "cmpl-standin", "object": "text_completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "text": " ok" * n, "finish_reason": "length", "logprobs": None}],
                "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}}

    @app.get("/metrics")
    async def metrics():
        labels = f'{{model_name="{model}"}}'
        return PlainTextResponse(
            f"vllm:num_requests_running{labels} {state['running']}\n"
            f"vllm:num_requests_waiting{labels} 0\n"
            f"vllm:gpu_cache_usage_perc{labels} 0.0\n"
            f"vllm:prompt_tokens_total{labels} {state['prompt']}\n"
            f"vllm:generation_tokens_total{labels} {state['generated']}\n")

    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="standin")
    p.add_argument("--startup-delay", type=float, default=0.5)
    p.add_argument("--latency", type=float, default=0.05)
    a = p.parse_args()
    uvicorn.run(make_app(a.model, a.startup_delay, a.latency), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
