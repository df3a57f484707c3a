"""Do new schemas stall running streams? Token gaps of plain streams while grammars arrive.

    python benchmarks/structured/grammar_gaps.py [--streams 3] [--schemas 8]

Starts ``llmserve engine`` at its defaults on the default model, runs ``--streams``
plain streams (temperature 0, ``ignore_eos``), measures their longest gap between
two tokens for a calm stretch, then sends ``--schemas`` structured-output requests,
each with a JSON schema the instance has never seen, while the streams run, and
measures the longest gap again. Issue 28's target: the loaded gap at most
max(250 ms, 4x the calm gap). Prints a markdown row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx

PORT = 8791
URL = f"http://127.0.0.1:{PORT}"


async def stream(client: httpx.AsyncClient, stamps: list[float], stop: asyncio.Event, i: int) -> None:
    body = {"prompt": f"Story number {i}: once upon a time", "max_tokens": 2000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    async with client.stream("POST", URL + "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                stamps.append(time.monotonic())
            if stop.is_set():
                break


def max_gap(stamps: list[float], start: float, end: float) -> float:
    inside = sorted(t for t in stamps if start <= t <= end)
    return max((b - a for a, b in zip(inside, inside[1:])), default=0.0)


def schema(i: int) -> dict:
    props = {f"field_{i}_{j}": {"type": "string", "maxLength": 12} for j in range(6)}
    props[f"count_{i}"] = {"type": "integer", "minimum": 0}
    return {"type": "object", "properties": props, "required": list(props)[:3], "additionalProperties": False}


async def run(args) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        stop = asyncio.Event()
        per = [[] for _ in range(args.streams)]
        tasks = [asyncio.create_task(stream(client, per[i], stop, i)) for i in range(args.streams)]
        while min(len(p) for p in per) < 5:
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await asyncio.sleep(args.calm_s)
        t1 = time.monotonic()

        async def constrained(i: int) -> None:
            body = {"messages": [{"role": "user", "content": f"Describe item {i} as JSON."}], "max_tokens": 32,
                    "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema(i)}}}
            r = await client.post(URL + "/v1/chat/completions", json=body)
            r.raise_for_status()

        await asyncio.gather(*(constrained(i) for i in range(args.schemas)))
        t2 = time.monotonic()
        stop.set()
        for t in tasks:
            t.cancel()
        calm = max(max_gap(p, t0, t1) for p in per)
        loaded = max(max_gap(p, t1, t2) for p in per)
        return {"calm_ms": calm * 1000, "loaded_ms": loaded * 1000, "schemas_s": t2 - t1}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--schemas", type=int, default=8)
    ap.add_argument("--calm-s", type=float, default=4.0)
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "llmserve.cli", "engine", "--port", str(PORT)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(URL + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        res = asyncio.run(run(args))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    bound = max(250.0, 4 * res["calm_ms"])
    print("| streams | new schemas | calm max gap (ms) | max gap while they compile (ms) | bound (ms) | met |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.streams} | {args.schemas} | {res['calm_ms']:.0f} | {res['loaded_ms']:.0f} | {bound:.0f} | "
          f"{'yes' if res['loaded_ms'] <= bound else 'no'} |")
    print(f"\n`{' '.join(cmd)}`; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
