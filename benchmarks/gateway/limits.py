"""What Redis-backed key limits cost the gateway (issue 32): one engine instance called
directly, through a gateway without limits, and through a gateway whose every request
is a named key's with every limit on (requests and tokens per minute, concurrency, a
priced monthly budget) counted in a real Redis, none of them reached.

The same rounds, workload and paired single requests as ``overhead.py`` (its helpers),
at concurrency 16; all three targets get the same bearer key (the engine and the open
gateway ignore it). Each limited request costs one Lua script at admission, one per
32 streamed tokens, and a pipelined settlement after its end.

    python benchmarks/gateway/limits.py [--quick]

Results: ``benchmarks/results/gateway_limits[-quick].{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as oh  # noqa: E402 - the gateway benchmarks' shared rounds and processes

KEY = "bench-key-0123456789"


def limits_yaml(path: Path, engine_url: str, redis_url: str, state_dir: Path) -> None:
    limits = {"requests_per_minute": 10_000_000, "tokens_per_minute": 10**12, "max_concurrent": 10_000,
              "budget": {"amount": 10**9, "period": "month"}}
    path.write_text(json.dumps({
        "models": [{"name": oh.SERVED, "price_per_1k_prompt_tokens": 0.5, "price_per_1k_completion_tokens": 1.5,
                    "versions": [{"name": "v1", "weight": 100, "upstreams": [engine_url]}]}],
        "auth": {"keys": [{"key": KEY, "name": "bench", "limits": limits}]},
        "state": {"dir": str(state_dir), "redis_url": redis_url}}, indent=1))


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
    path.write_text(path.read_text() + (
        "`gateway`: no keys, no limits; `limits`: every request a named key's with requests and tokens per "
        "minute, max_concurrent and a priced monthly budget on, counted in a local password-protected "
        "redis-server (state.redis_url), none reached. The machine is shared with other agents' work.\n"))
    print(path.read_text())


if __name__ == "__main__":
    main()
