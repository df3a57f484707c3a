"""A 10,000-line batch beside realtime traffic (issue 33's target): realtime TTFT p90
with the batch running against the same probe on the idle system, and how fast the
batch goes meanwhile.

One ``llmserve engine`` (a tiny random Llama like ``tests.helpers.make_tiny_llama``)
behind one ``llmserve gateway`` with a fresh state folder. A realtime probe (a
streamed chat request, ``max_tokens`` 8, one after another with a pause) measures
TTFT idle, then a batch of ``--lines`` chat lines (``max_tokens`` 8) is uploaded and
the same probe runs while the batch progresses; last, the batch is waited for.

    python benchmarks/batches/beside_realtime.py [--lines 10000] [--probes 60]

Results: ``benchmarks/results/batch_beside_realtime.{md,json}``.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers import make_tiny_llama  # noqa: E402
from tests.server.harness import free_port, start_engine  # noqa: E402


def ttft(url: str, i: int) -> float:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"probe {i}"}], "max_tokens": 8,
            "stream": True, "temperature": 0}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - t0
    raise RuntimeError("no token")


def probe(url: str, n: int, pause: float) -> list[float]:
    out = []
    for i in range(n):
        out.append(ttft(url, i))
        time.sleep(pause)
    return out


def p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--probes", type=int, default=60)
    ap.add_argument("--pause", type=float, default=0.2)
    ap.add_argument("--concurrency", type=int, default=2)  # batches.concurrency's default
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    eng = start_engine(make_tiny_llama(tmp / "model", max_position_embeddings=512), tmp, "--served-model-name",
                       "tiny")
    port = free_port()
    cfg = {"models": [{"name": "tiny", "versions": [{"name": "v1", "weight": 1.0, "upstreams": [eng.url]}]}],
           "state": {"dir": str(tmp / "state")}, "batches": {"concurrency": args.concurrency}}
    (tmp / "gw.yaml").write_text(yaml.safe_dump(cfg))
    gw = subprocess.Popen([sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(tmp / "gw.yaml"),
                           "--port", str(port), "--log-level", "warning"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        probe(url, 5, 0.05)  # warm
        idle = probe(url, args.probes, args.pause)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        lines = b"".join(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
            "model": "tiny", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 8}}).encode() + b"\n"
            for i in range(args.lines))
        f = client.files.create(file=("b.jsonl", io.BytesIO(lines)), purpose="batch")
        t0 = time.perf_counter()
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        time.sleep(2.0)  # let the batch fill the engine
        done0 = client.batches.retrieve(batch.id).request_counts.completed
        tw = time.perf_counter()
        busy = probe(url, args.probes, args.pause)
        done1 = client.batches.retrieve(batch.id).request_counts.completed
        rate = (done1 - done0) / (time.perf_counter() - tw)
        while (b := client.batches.retrieve(batch.id)).status != "completed":
            time.sleep(1.0)
        total_s = time.perf_counter() - t0
        out = client.files.content(b.output_file_id).text.splitlines()
        ids = {json.loads(x)["custom_id"] for x in out}
        res = {"lines": args.lines, "ttft_idle_p50_ms": 1000 * p(idle, 0.5),
               "ttft_idle_p90_ms": 1000 * p(idle, 0.9),
               "ttft_batch_p50_ms": 1000 * p(busy, 0.5), "ttft_batch_p90_ms": 1000 * p(busy, 0.9),
               "p90_ratio": p(busy, 0.9) / p(idle, 0.9), "batch_lines_per_s_during_probe": rate,
               "batch_total_s": total_s, "output_lines": len(out), "distinct_custom_ids": len(ids),
               "failed": b.request_counts.failed, "concurrency": args.concurrency}
        print(json.dumps(res, indent=1))
        rdir = ROOT / "benchmarks" / "results"
        rdir.mkdir(exist_ok=True)
        (rdir / "batch_beside_realtime.json").write_text(json.dumps(res, indent=1) + "\n")
        (rdir / "batch_beside_realtime.md").write_text(
            "# A batch beside realtime traffic\n\n`python benchmarks/batches/beside_realtime.py "
            f"--lines {args.lines} --probes {args.probes}` (2-core machine shared with other work)\n\n"
            "| | p50 | p90 |\n|---|---|---|\n"
            f"| realtime TTFT idle | {res['ttft_idle_p50_ms']:.1f} ms | {res['ttft_idle_p90_ms']:.1f} ms |\n"
            f"| realtime TTFT beside the batch | {res['ttft_batch_p50_ms']:.1f} ms | {res['ttft_batch_p90_ms']:.1f} ms |\n"
            f"\np90 ratio {res['p90_ratio']:.2f}; the batch ran {rate:.1f} lines/s during the probe and finished "
            f"{args.lines} lines in {total_s:.0f} s ({len(out)} output lines, {len(ids)} distinct custom_ids, "
            f"{b.request_counts.failed} failed).\n")
    finally:
        gw.terminate()
        gw.wait(timeout=10)
        eng.stop()


if __name__ == "__main__":
    main()
