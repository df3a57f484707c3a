"""What the gateway costs (issue 8): one engine instance called directly and through
``llmserve gateway``, and the gateway's own ceiling in front of a trivial upstream.

Part 1, overhead: one ``llmserve engine`` subprocess (default: a tiny random Llama
written like ``tests.helpers.make_tiny_llama``; ``--model SmolLM2-135M-Instruct``
takes the store's model) and one ``llmserve gateway`` subprocess in front of it.
This process runs ``llmserve bench`` (its Python API) against the instance and
against the gateway with the same seed and workload (streaming, ``ignore_eos``),
``--rounds`` times with the order rotated each round (two targets alternate), and reports TTFT p50/p99,
ITL p50 and output tok/s per run and the differences to the same round's direct
run (median over rounds).

Part 2, ceiling: a trivial upstream (a bare ASGI app under uvicorn, in its own
process, answering ``/v1/completions`` with a short SSE stream at once and ``/load``
and ``/ready`` for the gateway's polling) behind the same gateway, driven by a
lean keep-alive HTTP/1.1 client in a third process at high concurrency;
requests/s through the gateway against requests/s to the upstream directly, plus
each process's CPU time per request (the figure that survives a shared machine
best).

``--baseline-root DIR`` runs a second gateway from other code (e.g. ``git archive``
of an older commit unpacked in DIR) in the same rounds, for before/after figures
taken under the same machine load.

    python benchmarks/gateway/overhead.py [--quick] [--model SmolLM2-135M-Instruct]
        [--baseline-root DIR] [--only overhead|ceiling]
        [--profile]   # py-spy over the gateway during one extra ceiling run

Results: ``benchmarks/results/gateway_overhead[-quick][-<label>].{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from llmserve.autoscale.providers.process import terminate
from llmserve.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
from tables import md_table, pct  # noqa: E402 - the benchmarks' shared helpers, found via the line above
SERVED = "bench"  # the model name both the instance and the gateway answer to
FAKE = "fake"


# ---- processes --------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Proc:
    def __init__(self, name: str, cmd: list[str], logdir: Path, ready_url: str,
                 cwd: Path = ROOT) -> None:
        self.name, self.ready_url = name, ready_url
        self.log_path = logdir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 300.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                       f"{self.log_path.read_text()[-3000:]}")
                try:
                    if c.get(self.ready_url, timeout=1.0).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready after {timeout} s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        terminate(self.proc, 30.0)


def tiny_model(cache: Path) -> Path:
    """The tiny random Llama (deterministic bytes), written once per cache folder."""
    folder = cache / "tiny-llama"
    if not (folder / "config.json").exists():
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
                "from tests.helpers import make_tiny_llama; make_tiny_llama(Path(sys.argv[2]))")
        subprocess.run([sys.executable, "-c", code, str(ROOT), str(cache)], check=True, cwd=ROOT)
    return folder


def gateway_yaml(path: Path, engine_url: str, fake_url: str) -> None:
    # JSON is YAML; the gateway's defaults otherwise (polling, retry, admission).
    path.write_text(json.dumps({"models": [
        {"name": SERVED, "versions": [{"name": "v1", "weight": 100, "upstreams": [engine_url]}]},
        {"name": FAKE, "versions": [{"name": "v1", "weight": 100, "upstreams": [fake_url]}]},
    ]}, indent=1))


# ---- the trivial upstream (its own process) ---------------------------------------------
def fake_events(chunks: int, token_ids: bool = False) -> list[bytes]:
    """What a fast engine would stream: ``chunks`` one-token events, usage, [DONE]; with
    ``token_ids`` each chunk carries its id, as an engine asked for ``return_token_ids``
    writes it (the gateway asks when it may resume a stream)."""
    out = []
    for i in range(chunks):
        choice = {"index": 0, "text": f" tok{i}", "logprobs": None,
                  "finish_reason": "length" if i == chunks - 1 else None}
        if token_ids:
            choice["token_ids"] = [1000 + i]
        ev = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": FAKE,
              "choices": [choice]}
        out.append(b"data: " + json.dumps(ev).encode() + b"\n\n")
    usage = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": FAKE,
             "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": chunks,
                                      "total_tokens": 8 + chunks}}
    out.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def serve_fake(port: int, chunks: int, gap_s: float = 0.0) -> None:
    """A bare ASGI app (no framework routing) so the upstream costs as little as it can."""
    import uvicorn

    events, with_ids = fake_events(chunks), fake_events(chunks, token_ids=True)
    sse = [(b"content-type", b"text/event-stream; charset=utf-8")]
    js = [(b"content-type", b"application/json")]
    ok = json.dumps({"status": "ok"}).encode()
    whole = json.dumps({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": FAKE,
                        "choices": [{"index": 0, "text": "".join(f" tok{i}" for i in range(chunks)),
                                     "logprobs": None, "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 8, "completion_tokens": chunks,
                                  "total_tokens": 8 + chunks}}).encode()

    def load_report() -> bytes:
        return json.dumps({
            "instance_id": "fake", "model": FAKE, "ready": True, "draining": False,
            "num_running": 0, "num_waiting": 0, "num_waiting_by_priority": {},
            "kv_cache_usage": 0.0, "busy_fraction": 0.0, "tokens_per_s": 0.0,
            "generation_tokens_per_s": 0.0, "max_num_seqs": 4096,  # never the limit
            "prefix_cache_hit_rate": 0.0, "timestamp": time.time()}).encode()

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path in ("/v1/completions", "/v1/chat/completions"):
            body, more = b"", True
            while more:
                msg = await receive()
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
            if b'"stream": true' not in body:  # the JSON answer, as an engine's non-streaming one
                await send({"type": "http.response.start", "status": 200,
                            "headers": js + [(b"content-length", str(len(whole)).encode())]})
                await send({"type": "http.response.body", "body": whole})
                return
            await send({"type": "http.response.start", "status": 200, "headers": sse})
            for ev in with_ids if b'"return_token_ids": true' in body else events:
                await send({"type": "http.response.body", "body": ev, "more_body": True})
                await asyncio.sleep(gap_s)  # one write per event, as an engine's steps give
            await send({"type": "http.response.body", "body": b""})
            return
        if path in ("/load", "/ready", "/health"):
            body = load_report() if path == "/load" else ok
            await send({"type": "http.response.start", "status": 200, "headers": js})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": 404, "headers": js})
        await send({"type": "http.response.body", "body": b'{"error": "not found"}'})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---- the lean load driver (its own process) ---------------------------------------------
async def _drive(port: int, model: str, concurrency: int, total: int, warmup: int, stream: bool = True) -> dict:
    """``total`` completions (streamed, or whole JSON) over ``concurrency`` keep-alive connections."""
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4, "stream": stream}).encode()
    req = (f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
           f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
    latencies: list[float] = []
    firsts: list[float] = []
    errors: Counter[str] = Counter()
    remaining = [warmup, total]  # [warm-up left, measured left]
    started = asyncio.Event()
    ready = [0]
    t_start = [0.0]

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[bool, float, float]:
        t0 = time.perf_counter()
        writer.write(req)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        low = head.lower()
        first = 0.0
        data = bytearray()
        if b"transfer-encoding: chunked" in low:
            while True:
                n = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                if n == 0:
                    await reader.readuntil(b"\r\n")
                    break
                if not first:
                    first = time.perf_counter()
                data += (await reader.readexactly(n + 2))[:-2]
        else:
            m = re.search(rb"content-length: *(\d+)", low)
            data += await reader.readexactly(int(m.group(1)) if m else 0)
            first = time.perf_counter()
        if b"connection: close" in low:
            raise ConnectionResetError("server closed the connection")
        whole = data.endswith(b"data: [DONE]\n\n") if stream else data.startswith(b'{"id"')
        ok = status == 200 and whole and b'"error"' not in data
        if not ok:
            errors[f"status {status}" if status != 200 else "bad stream"] += 1
        return ok, first - t0, time.perf_counter() - t0

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while remaining[0] > 0:
                remaining[0] -= 1
                await one(reader, writer)
            ready[0] += 1
            if ready[0] == concurrency:
                t_start[0] = time.perf_counter()
                started.set()
            await started.wait()
            while remaining[1] > 0:
                remaining[1] -= 1
                try:
                    ok, first, lat = await one(reader, writer)
                except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                    errors[type(e).__name__] += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    continue
                if ok:
                    latencies.append(lat)
                    firsts.append(first)
        finally:
            writer.close()

    cpu0 = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t_start[0]
    return {"requests": total, "ok": len(latencies), "errors": dict(errors), "elapsed_s": elapsed,
            "requests_per_s": len(latencies) / elapsed, "latency_p50_ms": 1000 * pct(latencies, 50),
            "latency_p99_ms": 1000 * pct(latencies, 99), "first_byte_p50_ms": 1000 * pct(firsts, 50),
            "driver_cpu_s": time.process_time() - cpu0}


def drive_main(args: argparse.Namespace) -> None:
    import uvloop

    out = uvloop.run(_drive(args.port, args.model_name, args.conns, args.requests, args.warmup,
                            stream=not args.json))
    # A file, not stdout: the event loop may leave stdout non-blocking, cutting a long write.
    Path(args.out).write_text(json.dumps(out))


# ---- the measurement --------------------------------------------------------------------
def median(values: list[float]) -> float:
    import numpy as np

    return float(np.median(values)) if values else float("nan")


def bench_once(url: str, args: argparse.Namespace, tokenizer: str | None, seed: int,
               pids: dict[str, int]) -> dict[str, Any]:
    from llmserve.bench.cli import execute
    from llmserve.bench.client import EndpointConfig
    from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig

    cfg = BenchConfig(
        endpoint=EndpointConfig(base_url=url, model=SERVED, ignore_eos=True, timeout_s=600,
                                api_key=getattr(args, "api_key", None)),  # (limits.py: a named key)
        dataset=DatasetConfig(name="random", tokenizer=tokenizer, random_input_len=args.input_len,
                              random_output_len=args.output_len),
        load=LoadConfig(num_prompts=args.num_prompts, max_concurrency=args.concurrency,
                        num_warmups=args.concurrency, seed=seed),
        percentiles=(50.0, 99.0), show_progress=False)
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    la0 = os.getloadavg()[0]
    r = execute(cfg)
    s = r.summary
    if s.failed:
        raise RuntimeError(f"{url}: {s.failed} requests failed: {s.failures_by_kind}")
    cpu = {k: cpu_s(p) - cpu0[k] for k, p in pids.items()}
    n = s.num_requests + args.concurrency  # the warm-ups ran in the same CPU window
    return {
        "ttft_p50_ms": s.ttft.percentiles_ms["p50"], "ttft_p99_ms": s.ttft.percentiles_ms["p99"],
        "itl_p50_ms": s.itl.percentiles_ms["p50"], "tpot_mean_ms": s.tpot.mean_ms,
        "e2el_p50_ms": s.e2el.percentiles_ms["p50"],
        "output_tok_s": s.output_throughput, "requests": s.num_requests,
        "output_tokens": s.total_output_tokens, "duration_s": s.duration_s,
        "cpu_ms_per_request": {k: 1000 * v / n for k, v in cpu.items()},
        "loadavg_1min": la0,
    }


def rotation(targets: list[str], rnd: int) -> list[str]:
    """This round's order: rotated each round, so no target always runs first or last."""
    k = rnd % len(targets)
    return targets[k:] + targets[:k]


def run_order(targets: list[str], rnd: int) -> list[str]:
    """A bench round's order. Rotating two targets (AB, BA, AB, ...) runs each twice in a
    row every other round, and a stack that has just run is slower than one that rested
    (benchmarks/tracing/README.md: ~8 % more engine CPU per request): so two strictly
    alternate, each run following the other's. Three or more rotate, which never repeats
    one across a round's boundary."""
    return list(targets) if len(targets) == 2 else rotation(targets, rnd)


def overhead(args: argparse.Namespace, urls: dict[str, str], tokenizer: str | None,
             pids: dict[str, int]) -> dict[str, Any]:
    """Bench runs per round over ``urls`` (direct, gateway[, baseline]); diffs vs direct."""
    runs: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        got = {}
        for target in run_order(list(urls), rnd):
            m = bench_once(urls[target], args, tokenizer, args.seed, pids)
            m.update(round=rnd, target=target, own_gateway_cpu_ms=m["cpu_ms_per_request"].get(target))
            runs.append(m)
            got[target] = m
            own = m["own_gateway_cpu_ms"]
            print(f"  round {rnd} {target:8s}: TTFT p50 {m['ttft_p50_ms']:.2f} ms, p99 "
                  f"{m['ttft_p99_ms']:.2f} ms, ITL p50 {m['itl_p50_ms']:.2f} ms, "
                  f"{m['output_tok_s']:.1f} tok/s"
                  + (f", its gateway's CPU {own:.2f} ms/req" if own is not None else "")
                  + f" (load {m['loadavg_1min']:.2f})", flush=True)
        d = got["direct"]
        for target in urls:
            if target == "direct":
                continue
            g = got[target]
            pairs.append({"round": rnd, "target": target,
                          "ttft_p50_ms": g["ttft_p50_ms"] - d["ttft_p50_ms"],
                          "ttft_p99_ms": g["ttft_p99_ms"] - d["ttft_p99_ms"],
                          "itl_p50_ms": g["itl_p50_ms"] - d["itl_p50_ms"],
                          "throughput_ratio": g["output_tok_s"] / d["output_tok_s"],
                          "gateway_cpu_ms_per_request": g["own_gateway_cpu_ms"]})
    keys = ["ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "throughput_ratio", "gateway_cpu_ms_per_request"]
    med = {t: {k: median([p[k] for p in pairs if p["target"] == t]) for k in keys}
           for t in urls if t != "direct"}
    return {"runs": runs, "pairs": pairs, "median": med}


def paired_ttft(args: argparse.Namespace, urls: dict[str, str], tokenizer: str | None) -> dict[str, Any]:
    """Single requests at concurrency 1, the targets taking turns request by request
    (order rotated): the TTFT difference within each turn, where the machine's load
    has had no time to change, is what the gateway adds. The bench's own client
    (``send_request``) times them."""
    from llmserve.bench.client import EndpointConfig, make_http_client, send_request
    from llmserve.bench.datasets import random_dataset
    from llmserve.bench.metrics import ttft
    from llmserve.bench.tokenizer import load_tokenizer

    reqs = random_dataset(load_tokenizer(tokenizer), args.pairs, args.input_len, args.paired_output_len,
                          seed=args.seed + 2)
    cfgs = {t: EndpointConfig(base_url=u, model=SERVED, ignore_eos=True, timeout_s=600,
                              api_key=getattr(args, "api_key", None)) for t, u in urls.items()}

    async def run() -> list[dict[str, float]]:
        clients = {t: make_http_client(1) for t in urls}
        try:
            for t in urls:  # connections open and warm before timing
                await send_request(clients[t], cfgs[t], reqs[0], -1, time.perf_counter())
            rows = []
            for i, req in enumerate(reqs):
                row = {}
                for t in rotation(list(urls), i):
                    rec = await send_request(clients[t], cfgs[t], req, i, time.perf_counter())
                    if not rec.success:
                        raise RuntimeError(f"{t}: {rec.error}")
                    row[t] = 1000 * ttft(rec)
                rows.append(row)
            return rows
        finally:
            for c in clients.values():
                await c.aclose()

    la0 = os.getloadavg()[0]
    rows = asyncio.run(run())
    out: dict[str, Any] = {"pairs": len(rows), "loadavg_1min": la0, "rows": rows, "targets": {}}
    for t in urls:
        m = {"ttft_p50_ms": median([r[t] for r in rows])}
        if t != "direct":
            diffs = [r[t] - r["direct"] for r in rows]
            m.update(diff_p50_ms=median(diffs), diff_p25_ms=pct(diffs, 25), diff_p75_ms=pct(diffs, 75))
        out["targets"][t] = m
        extra = (f", minus direct: median {m['diff_p50_ms']:+.2f} ms (IQR {m['diff_p25_ms']:+.2f} .. "
                 f"{m['diff_p75_ms']:+.2f})") if t != "direct" else ""
        print(f"  {t:8s}: TTFT p50 {m['ttft_p50_ms']:.2f} ms{extra}", flush=True)
    return out


def drive(port: int, model: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "_drive", "--port", str(port), "--model-name", model,
           "--conns", str(args.ceiling_concurrency), "--requests", str(args.ceiling_requests),
           "--warmup", str(2 * args.ceiling_concurrency)] + (["--json"] if args.ceiling_json else [])
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(cmd + ["--out", f.name], check=True, cwd=ROOT, timeout=600)
        return json.loads(Path(f.name).read_text())


def ceiling(args: argparse.Namespace, ports: dict[str, int], pids: dict[str, int],
            profile_to: Path | None) -> dict[str, Any]:
    """The lean driver against the fake upstream directly and through each gateway."""
    runs = []
    for rnd in range(args.rounds):
        for target in rotation(list(ports), rnd):
            cpu0 = {k: cpu_s(p) for k, p in pids.items()}
            la0 = os.getloadavg()[0]
            r = drive(ports[target], FAKE, args)
            n = r["requests"] + 2 * args.ceiling_concurrency
            cpu = {k: 1000 * (cpu_s(p) - cpu0[k]) / n for k, p in pids.items()}
            m = {"round": rnd, "target": target, "requests_per_s": r["requests_per_s"], "ok": r["ok"],
                 "errors": r["errors"], "latency_p50_ms": r["latency_p50_ms"],
                 "latency_p99_ms": r["latency_p99_ms"], "first_byte_p50_ms": r["first_byte_p50_ms"],
                 "cpu_ms_per_request": {**cpu, "driver": 1000 * r["driver_cpu_s"] / n},
                 "own_gateway_cpu_ms": cpu.get(target), "loadavg_1min": la0}
            runs.append(m)
            own = m["own_gateway_cpu_ms"]
            print(f"  round {rnd} {target:8s}: {m['requests_per_s']:.0f} req/s, latency p50 "
                  f"{m['latency_p50_ms']:.1f} ms"
                  + (f", its gateway's CPU {own:.2f} ms/req" if own is not None else "")
                  + f", upstream {m['cpu_ms_per_request']['fake']:.2f}, driver "
                  f"{m['cpu_ms_per_request']['driver']:.2f}, errors {r['errors']} (load {la0:.2f})", flush=True)
    out: dict[str, Any] = {"runs": runs, "median": {}}
    for target in ports:
        rs = [r for r in runs if r["target"] == target]
        med = {"requests_per_s": median([r["requests_per_s"] for r in rs]),
               "latency_p50_ms": median([r["latency_p50_ms"] for r in rs])}
        if target != "direct":
            g = median([r["own_gateway_cpu_ms"] for r in rs])
            med.update(gateway_cpu_ms_per_request=g, one_core_ceiling_rps=1000 / g if g > 0 else float("inf"))
        out["median"][target] = med
    if profile_to is not None:
        out["profile"] = profile(args, ports["gateway"], pids["gateway"], profile_to)
    return out


def profile(args: argparse.Namespace, gw_port: int, gw_pid: int, out_path: Path) -> dict[str, Any]:
    """py-spy over the gateway during one more ceiling run; top frames by own and total time."""
    raw = Path(tempfile.mkdtemp(prefix="gw-spy-")) / "gateway.collapsed"  # raw stacks stay out of the repo
    spy = subprocess.Popen(["py-spy", "record", "-p", str(gw_pid), "-r", "250", "-f", "raw", "-o", str(raw),
                            "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    try:
        drive(gw_port, FAKE, args)
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        k = int(n)
        samples += k
        own[frames[-1]] += k
        for f in set(frames):
            total[f] += k
    lines = [f"# py-spy over the gateway, {samples} samples", "", "## own time", ""]
    lines += [f"{100 * v / samples:5.1f}%  {f}" for f, v in own.most_common(40)]
    lines += ["", "## total time", ""]
    lines += [f"{100 * v / samples:5.1f}%  {f}" for f, v in total.most_common(80)]
    out_path.write_text("\n".join(lines) + "\n")
    print(f"  profile: {out_path}", flush=True)
    return {"samples": samples, "file": str(out_path)}


# ---- results ----------------------------------------------------------------------------
def git(*a: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict[str, Any]:
    commit = git("rev-parse", "--short", "HEAD").strip() or "?"
    changed = git("diff", "HEAD", "--name-only", "--", "llmserve/gateway", "benchmarks/gateway").split()
    if changed:
        commit += f" + uncommitted changes to {', '.join(changed)}"
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host_cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(), "python": platform.python_version(), "git_commit": commit}


def write(name: str, info: dict[str, Any], args: argparse.Namespace, over: dict[str, Any] | None,
          ceil: dict[str, Any] | None) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = {**info, "loadavg_end": os.getloadavg()}
    la0, la1 = info["loadavg_start"], info["loadavg_end"]
    md = [f"# {name}", "", f"`{info['command']}`  ",
          f"{info['date']}, {info['host_cpus']} CPUs, Python {info['python']}, commit {info['git_commit']}  ",
          f"load average (1/5/15 min) at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, "
          f"at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}", ""]
    if args.baseline_root:
        md += [f"`baseline`: the same gateway command run from the code in `{args.baseline_root}` "
               f"({info.get('baseline')}); `gateway`: this checkout's code.", ""]
    if over is not None:
        md += ["## Overhead: one instance, direct and through the gateway", "",
               f"model {args.model}, engine `--threads {args.threads}`; {args.num_prompts} prompts "
               f"{args.input_len} in / {args.output_len} out (ignore_eos, streaming), concurrency "
               f"{args.concurrency}, seed {args.seed}, {args.rounds} rounds, the order rotated each round (two alternate); "
               "the bench client in this process, engine and gateway(s) in their own.", ""]
        rows = [[r["round"], r["target"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["itl_p50_ms"],
                 r["output_tok_s"], "-" if r["own_gateway_cpu_ms"] is None else r["own_gateway_cpu_ms"],
                 r["loadavg_1min"]] for r in over["runs"]]
        md += [md_table(["round", "target", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "output tok/s",
                         "its gateway's CPU ms/req", "load 1 min"], rows), ""]
        md += ["Per round, minus direct in the same round (median over rounds):", ""]
        rows = [[t, f"{m['ttft_p50_ms']:+.2f} ms", f"{m['ttft_p99_ms']:+.2f} ms", f"{m['itl_p50_ms']:+.2f} ms",
                 f"{m['throughput_ratio']:.3f}", f"{m['gateway_cpu_ms_per_request']:.2f} ms"]
                for t, m in over["median"].items()]
        md += [md_table(["through", "TTFT p50", "TTFT p99", "ITL p50", "tok/s vs direct",
                         "gateway CPU per request"], rows), ""]
        pr = over["paired"]
        md += [f"TTFT of single requests (concurrency 1, {args.input_len} in / {args.paired_output_len} out), "
               f"{pr['pairs']} per target, the targets taking turns request by request (load "
               f"{pr['loadavg_1min']:.2f}); the difference is taken within each turn:", ""]
        rows = [[t, m["ttft_p50_ms"], "-" if t == "direct" else f"{m['diff_p50_ms']:+.2f} ms",
                 "-" if t == "direct" else f"{m['diff_p25_ms']:+.2f} .. {m['diff_p75_ms']:+.2f} ms"]
                for t, m in pr["targets"].items()]
        md += [md_table(["target", "TTFT p50 ms", "minus direct, median", "minus direct, IQR"], rows), ""]
    if ceil is not None:
        md += ["## Ceiling: a trivial upstream behind the gateway", "",
               (f"{args.ceiling_requests} non-streaming completions per run (one JSON answer) "
                if args.ceiling_json else
                f"{args.ceiling_requests} streamed completions per run ({args.ceiling_chunks} token events + "
                f"usage + [DONE], {args.ceiling_gap_ms:g} ms apart; each chunk with its token id when the gateway asks for them, as an engine "
                "does)") + f" over {args.ceiling_concurrency} keep-alive connections from a separate "
               "driver process; CPU ms per request of each process over the run.", ""]
        rows = [[r["round"], r["target"], r["requests_per_s"], r["latency_p50_ms"], r["latency_p99_ms"],
                 "-" if r["own_gateway_cpu_ms"] is None else r["own_gateway_cpu_ms"],
                 r["cpu_ms_per_request"]["fake"], r["cpu_ms_per_request"]["driver"], r["loadavg_1min"]]
                for r in ceil["runs"]]
        md += [md_table(["round", "target", "req/s", "latency p50 ms", "latency p99 ms",
                         "its gateway's CPU ms/req", "upstream CPU ms/req", "driver CPU ms/req", "load 1 min"],
                        rows), ""]
        rows = [[t, m["requests_per_s"], m["latency_p50_ms"], m.get("gateway_cpu_ms_per_request", "-"),
                 m.get("one_core_ceiling_rps", "-")] for t, m in ceil["median"].items()]
        md += ["Medians over rounds:", "",
               md_table(["target", "req/s", "latency p50 ms", "gateway CPU ms/req",
                         "one core's worth of requests/s (1000 / CPU ms)"], rows), ""]
        if "profile" in ceil:
            md += [f"Profile: `{os.path.relpath(ceil['profile']['file'], ROOT)}`", ""]
    stem = RESULTS / name
    stem.with_suffix(".md").write_text("\n".join(md))
    data = {"machine": info, "args": vars(args), "overhead": over, "ceiling": ceil}
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1))
    return stem.with_suffix(".md")


def main_run(args: argparse.Namespace) -> None:
    if args.quick:
        args.rounds, args.num_prompts, args.ceiling_requests, args.pairs = 2, 16, 1000, 30
    name = "gateway_overhead" + ("-quick" if args.quick else "") + (f"-{args.label}" if args.label else "")
    info = machine()
    info["command"] = "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    cache = Path(tempfile.gettempdir()) / "llmserve-gateway-bench"
    cache.mkdir(exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="gw-bench-", dir=cache))
    tokenizer = args.tokenizer
    if args.model == "tiny":
        model_path = str(tiny_model(cache))
        tokenizer = tokenizer or model_path
    else:
        model_path = args.model
    e_port, f_port = free_port(), free_port()
    roots = {"gateway": ROOT}
    if args.baseline_root:
        roots["baseline"] = Path(args.baseline_root).resolve()
        if not (roots["baseline"] / "llmserve" / "gateway").is_dir():
            raise SystemExit(f"{roots['baseline']} has no llmserve/gateway")
        marker = roots["baseline"] / "COMMIT"  # what `git archive` leaves out, written by hand
        info["baseline"] = (git("-C", str(roots["baseline"]), "rev-parse", "--short", "HEAD").strip()
                            or (marker.read_text().strip() if marker.exists() else "unknown code"))
    procs: list[Proc] = []
    try:
        engine = Proc("engine", [sys.executable, "-m", "llmserve.cli", "engine", "--model", model_path,
                                 "--threads", str(args.threads), "--port", str(e_port),
                                 "--served-model-name", SERVED,
                                 # Every run repeats the same prompts: without this, all but the
                                 # first would be served from the prefix cache.
                                 "--no-enable-prefix-caching"], logdir, f"http://127.0.0.1:{e_port}/ready")
        procs.append(engine)
        fake = Proc("fake", [sys.executable, __file__, "_fake", "--port", str(f_port),
                             "--chunks", str(args.ceiling_chunks), "--gap-ms", str(args.ceiling_gap_ms)], logdir, f"http://127.0.0.1:{f_port}/ready")
        procs.append(fake)
        cfg = logdir / "gateway.yaml"
        gateway_yaml(cfg, f"http://127.0.0.1:{e_port}", f"http://127.0.0.1:{f_port}")
        gw_ports: dict[str, int] = {}
        gws: dict[str, Proc] = {}
        for gname, root in roots.items():
            port = free_port()
            # ``python -m`` imports the package from its working folder: the chosen code tree.
            gws[gname] = Proc(gname, [sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(cfg),
                                      "--port", str(port)], logdir, f"http://127.0.0.1:{port}/ready",
                              cwd=root)
            procs.append(gws[gname])
            gw_ports[gname] = port
        engine.wait_ready()
        fake.wait_ready()
        for g in gws.values():
            g.wait_ready()
        print(f"engine :{e_port}, fake upstream :{f_port}, gateways {gw_ports}; logs {logdir}", flush=True)
        pids = {"engine": engine.pid, "fake": fake.pid, **{n: g.pid for n, g in gws.items()}}
        urls = {"direct": f"http://127.0.0.1:{e_port}/v1",
                **{n: f"http://127.0.0.1:{p}/v1" for n, p in gw_ports.items()}}
        over = ceil = None
        if args.only in (None, "overhead"):
            # Untimed: warm every path (first-request imports, connection pools, engine caches).
            warm = argparse.Namespace(**{**vars(args), "num_prompts": args.concurrency})
            for url in urls.values():
                bench_once(url, warm, tokenizer, args.seed + 1, pids)
            print("overhead (bench, same seed and workload):", flush=True)
            over = overhead(args, urls, tokenizer, pids)
            print(f"TTFT, {args.pairs} single requests per target taking turns:", flush=True)
            over["paired"] = paired_ttft(args, urls, tokenizer)
        if args.only in (None, "ceiling"):
            print("ceiling (trivial upstream):", flush=True)
            prof = RESULTS / f"{name}-profile.txt" if args.profile else None
            ceil = ceiling(args, {"direct": f_port, **gw_ports}, pids, prof)
    finally:
        for p in reversed(procs):
            p.stop()
    path = write(name, info, args, over, ceil)
    print(path.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role")
    f = sub.add_parser("_fake", help="internal: the trivial upstream")
    f.add_argument("--port", type=int, required=True)
    f.add_argument("--chunks", type=int, default=4)
    f.add_argument("--gap-ms", type=float, default=0.0, help="pause between events")
    d = sub.add_parser("_drive", help="internal: the ceiling's load driver")
    d.add_argument("--port", type=int, required=True)
    d.add_argument("--model-name", default=FAKE)
    d.add_argument("--conns", type=int, default=64)
    d.add_argument("--requests", type=int, default=4000)
    d.add_argument("--warmup", type=int, default=128)
    d.add_argument("--out", required=True, help="where the JSON summary goes")
    d.add_argument("--json", action="store_true", help="non-streaming requests")
    p.add_argument("--model", default="tiny",
                   help="'tiny' (a tiny random Llama, the default) or a model store name / path")
    p.add_argument("--tokenizer", default=None, help="for exact prompt lengths (tiny: its own)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4, help="runs per target, the order rotated each round")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pairs", type=int, default=100, help="single requests per target for the paired TTFT")
    p.add_argument("--paired-output-len", type=int, default=4)
    p.add_argument("--ceiling-concurrency", type=int, default=64)
    p.add_argument("--ceiling-requests", type=int, default=4000)
    p.add_argument("--ceiling-chunks", type=int, default=4, help="token events per fake stream")
    p.add_argument("--ceiling-gap-ms", type=float, default=0.0,
                   help="pause between the fake's events (> 0: one event per read, as from an engine)")
    p.add_argument("--ceiling-json", action="store_true",
                   help="the ceiling with non-streaming requests (whole JSON answers)")
    p.add_argument("--profile", action="store_true", help="py-spy over the gateway in one more ceiling run")
    p.add_argument("--label", default=None, help="suffix for the results files (e.g. before)")
    p.add_argument("--baseline-root", default=None, metavar="DIR",
                   help="also run a gateway from the llmserve code in DIR (e.g. an older commit's "
                        "`git archive`), interleaved with this checkout's")
    p.add_argument("--only", choices=["overhead", "ceiling"], default=None)
    p.add_argument("--quick", action="store_true", help="2 rounds, 16 prompts, 30 pairs, 1000 ceiling requests")
    args = p.parse_args()
    if args.role == "_fake":
        serve_fake(args.port, args.chunks, args.gap_ms / 1000)
    elif args.role == "_drive":
        drive_main(args)
    else:
        main_run(args)


if __name__ == "__main__":
    main()
