"""What Redis-backed key limits cost the gateway (issue 32): one engine instance called
directly, through a gateway without limits, and through a gateway whose every request
is a named key's with every limit on (requests and tokens per minute, concurrency, a
priced monthly budget) counted in a real Redis, none of them reached.

The same rounds, workload and paired single requests as ``overhead.py`` (its helpers),
at concurrency 16; all three targets get the same bearer key (the engine and the open
gateway ignore it). Each limited request costs one Lua script at admission (its budget
covers the whole stream, so no charge on the way) and a pipelined settlement after it.

First, what the limiter itself costs, without HTTP: ``admit`` + settle of 2,000
requests in this process against the in-memory store and the same Redis, as CPU per
request (the figure a shared machine disturbs least) and admission latency. Then
three gateways in this process (the tests' harness) in front of one trivial upstream:
a named key without limits, the limits in memory, the limits in Redis, taking turns
request by request, so that the difference in each request's latency is what the
limits add under the same machine load.

    python benchmarks/gateway/limits.py [--quick]

Results: ``benchmarks/results/gateway_limits[-quick].{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as oh  # noqa: E402 - the gateway benchmarks' shared rounds and processes

KEY = "bench-key-0123456789"
# Every limit on, none reached: each request pays for all of them.
LIMITS = {"requests_per_minute": 10_000_000, "tokens_per_minute": 10**12, "max_concurrent": 10_000,
          "budget": {"amount": 10**9, "period": "month"}}


def limits_yaml(path: Path, engine_url: str, redis_url: str, state_dir: Path) -> None:
    path.write_text(json.dumps({
        "models": [{"name": oh.SERVED, "price_per_1k_prompt_tokens": 0.5, "price_per_1k_completion_tokens": 1.5,
                    "versions": [{"name": "v1", "weight": 100, "upstreams": [engine_url]}]}],
        "auth": {"keys": [{"key": KEY, "name": "bench", "limits": LIMITS}]},
        "state": {"dir": str(state_dir), "redis_url": redis_url}}, indent=1))


def limiter_cost(redis_url: str, n: int = 2000) -> dict[str, Any]:
    """CPU per admitted + settled request and admission latency, in memory and in Redis."""
    from llmserve.gateway.batches.config import StateConfig
    from llmserve.gateway.metrics import GatewayMetrics
    from llmserve.gateway.tenants.config import KeyLimits, Prices
    from llmserve.gateway.tenants.limiter import Tenants

    limits, body = KeyLimits.model_validate(LIMITS), {"max_tokens": 64}

    async def one_store(url: str | None) -> dict[str, float]:
        t = Tenants({"k": limits}, {"m": Prices(prompt=0.5, completion=1.5)}, StateConfig(redis_url=url), 660.0,
                    GatewayMetrics(lambda: []))
        await t.start()
        try:
            lat = []
            for i in range(n + 200):  # the first 200 warm up
                if i == 200:
                    cpu0 = time.process_time()
                a = time.perf_counter()
                tab = await t.admit("k", "m", body, 512, True, f"r{i}")
                lat.append(time.perf_counter() - a)
                tab.close(None, 64, served=True)
                await asyncio.sleep(0)  # the settlement's turn, as between requests
            await asyncio.gather(*t._tasks)
            cpu = time.process_time() - cpu0
        finally:
            await t.stop()
        lat = sorted(lat[200:])
        return {"cpu_ms_per_request": 1000 * cpu / n, "admit_p50_ms": 1000 * lat[n // 2],
                "admit_p99_ms": 1000 * lat[int(n * 0.99)]}

    out = {"memory": asyncio.run(one_store(None)), "redis": asyncio.run(one_store(redis_url)),
           "loadavg_1min": os.getloadavg()[0], "requests": n}
    for store in ("memory", "redis"):
        m = out[store]
        print(f"  {store:6s}: {m['cpu_ms_per_request']:.3f} ms CPU per request (admit + settle), admission "
              f"p50 {m['admit_p50_ms']:.3f} ms, p99 {m['admit_p99_ms']:.3f} ms", flush=True)
    return out


def paired_stacks(redis_url: str, n: int, state_dir: Path) -> dict[str, Any]:
    """Median whole-request latency of 16-token streams through three gateways taking turns."""
    import contextlib

    from tests.gateway.app_harness import stack
    from tests.gateway.fake_upstream import Behaviour

    keys = {"named": [{"key": KEY, "name": "bench"}], "memory": [{"key": KEY, "name": "bench", "limits": LIMITS}],
            "redis": [{"key": KEY, "name": "bench", "limits": LIMITS}]}
    with contextlib.ExitStack() as es:
        stacks = {}
        for name, key_list in keys.items():
            state = {"dir": str(state_dir / name), **({"redis_url": redis_url} if name == "redis" else {})}
            stacks[name] = es.enter_context(stack({"v1": [Behaviour(name, tokens=16)]}, client_key=KEY,
                                                  auth={"keys": key_list}, state=state))
        lat: dict[str, list[float]] = {name: [] for name in stacks}
        for i in range(n + 50):  # the first 50 warm up
            for name in oh.rotation(list(stacks), i):
                t0 = time.perf_counter()
                if stacks[name].chat(stream=True, max_tokens=16).status_code != 200:
                    raise RuntimeError(f"{name}: a request failed")
                if i >= 50:
                    lat[name].append(1000 * (time.perf_counter() - t0))
    out = {name: {"p50_ms": oh.median(v)} for name, v in lat.items()}
    for name in ("memory", "redis"):
        diffs = [a - b for a, b in zip(lat[name], lat["named"])]
        out[name].update(diff_p50_ms=oh.median(diffs), diff_p25_ms=oh.pct(diffs, 25), diff_p75_ms=oh.pct(diffs, 75))
    for name, m in out.items():
        extra = "" if name == "named" else f", minus named: median {m['diff_p50_ms']:+.2f} ms"
        print(f"  {name:6s}: request p50 {m['p50_ms']:.2f} ms{extra}", flush=True)
    return {**out, "requests": n, "loadavg_1min": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pairs", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="2 rounds, 32 prompts, 30 pairs")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.num_prompts, args.pairs = 2, 32, 30
    args.__dict__.update(model="tiny", threads=1, input_len=128, output_len=64, seed=0, paired_output_len=4,
                         baseline_root=None, api_key=KEY)
    name = "gateway_limits" + ("-quick" if args.quick else "")
    info = oh.machine()
    info["command"] = "python " + " ".join([os.path.relpath(sys.argv[0], oh.ROOT)] + sys.argv[1:])
    cache = Path(tempfile.gettempdir()) / "llmserve-gateway-bench"
    cache.mkdir(exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="gw-limits-", dir=cache))
    model = str(oh.tiny_model(cache))
    sys.path.insert(0, str(oh.ROOT))
    from tests.redis_server import RedisServer  # a password-protected redis-server on a free port

    redis = RedisServer(logdir / "redis").start()
    procs: list[oh.Proc] = []
    try:
        print("the limiter alone:", flush=True)
        cost = limiter_cost(redis.url)
        print("gateways taking turns in front of a trivial upstream:", flush=True)
        turns = paired_stacks(redis.url, args.pairs * 5, logdir / "stacks")
        e_port = oh.free_port()
        engine = oh.Proc("engine", [sys.executable, "-m", "llmserve.cli", "engine", "--model", model, "--threads", "1",
                                    "--port", str(e_port), "--served-model-name", oh.SERVED,
                                    "--no-enable-prefix-caching"], logdir, f"http://127.0.0.1:{e_port}/ready")
        procs.append(engine)
        engine_url = f"http://127.0.0.1:{e_port}"
        plain, limited = logdir / "gateway.yaml", logdir / "limits.yaml"
        oh.gateway_yaml(plain, engine_url, engine_url)
        limits_yaml(limited, engine_url, redis.url, logdir / "state")
        ports = {}
        for gname, cfg in (("gateway", plain), ("limits", limited)):
            ports[gname] = oh.free_port()
            procs.append(oh.Proc(gname, [sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(cfg),
                                         "--port", str(ports[gname])], logdir,
                                 f"http://127.0.0.1:{ports[gname]}/ready"))
        for proc in procs:
            proc.wait_ready()
        pids = {proc.name: proc.pid for proc in procs}
        urls = {"direct": f"{engine_url}/v1", **{n: f"http://127.0.0.1:{port}/v1" for n, port in ports.items()}}
        warm = argparse.Namespace(**{**vars(args), "num_prompts": args.concurrency})
        for url in urls.values():
            oh.bench_once(url, warm, model, args.seed + 1, pids)
        print(f"overhead at concurrency {args.concurrency} (logs {logdir}):", flush=True)
        over = oh.overhead(args, urls, model, pids)
        print(f"TTFT, {args.pairs} single requests per target taking turns:", flush=True)
        over["paired"] = oh.paired_ttft(args, urls, model)
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis.stop()
    path = oh.write(name, info, args, over, None)
    rows = [[store, cost[store]["cpu_ms_per_request"], cost[store]["admit_p50_ms"], cost[store]["admit_p99_ms"]]
            for store in ("memory", "redis")]
    path.write_text(path.read_text() + (
        "`gateway`: no keys, no limits; `limits`: every request a named key's with requests and tokens per "
        "minute, max_concurrent and a priced monthly budget on, counted in a local password-protected "
        "redis-server (state.redis_url), none reached. The machine is shared with other agents' work.\n\n"
        f"## The limiter alone\n\n{cost['requests']} streamed requests admitted and settled in one process "
        f"(load {cost['loadavg_1min']:.2f}), no HTTP:\n\n"
        + oh.md_table(["store", "CPU ms per request", "admission p50 ms", "admission p99 ms"], rows) + "\n\n"
        f"## Gateways taking turns, trivial upstream\n\n{turns['requests']} streamed requests (16 tokens) per "
        f"gateway, all three in this process, the order rotated each turn (load {turns['loadavg_1min']:.2f}):\n\n"
        + oh.md_table(["gateway", "request p50 ms", "minus named key, median", "minus named key, IQR"],
                      [[n, turns[n]["p50_ms"], "-" if n == "named" else f"{turns[n]['diff_p50_ms']:+.2f} ms",
                        "-" if n == "named" else f"{turns[n]['diff_p25_ms']:+.2f} .. {turns[n]['diff_p75_ms']:+.2f} ms"]
                       for n in ("named", "memory", "redis")]) + "\n"))
    data = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps({**data, "limiter": cost, "turns": turns}, indent=1))
    print(path.read_text())


if __name__ == "__main__":
    main()
