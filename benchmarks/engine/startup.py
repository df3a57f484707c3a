"""Start-to-ready of an instance (issue 5): cold, warm, and warm forked from the template.

Each start goes through the local provider, the way ``llmserve serve`` starts
instances, and is timed from ``provider.start`` to the first ``/ready`` 200 (weights
loaded and a warm-up generation run):

- cold: a fresh model store holding only the GGUF (dequantised, converted and
  written as safetensors during start-up), a fresh interpreter;
- warm, spawned: the same store again (the converted copy is memory-mapped), a
  fresh interpreter (``fork_from_template: false``);
- warm, forked: the same store, the instance forked from the template process
  that has already imported torch and the server (the provider's default).

    python benchmarks/engine/startup.py [--reps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import MODEL, command_line, load, loadavg, machine, md_table, write_results

from llmserve.autoscale.providers.base import InstanceSpec
from llmserve.autoscale.providers.local import LocalProvider, LocalProviderConfig


async def start_to_ready(provider: LocalProvider, iid: str, args: list[str]) -> dict[str, Any]:
    t0 = time.monotonic()
    handle = await provider.start(InstanceSpec(iid, tuple(args)))
    async with httpx.AsyncClient() as c:
        while True:
            try:
                r = await c.get(handle.url + "/ready", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if (await provider.status(handle)).gone:
                raise RuntimeError(await provider.log_tail(handle, 40))
            await asyncio.sleep(0.01)
    wall = time.monotonic() - t0
    code = await provider.stop(handle, 30)
    return {"start_to_ready_s": wall, "server_ready_after_s": r.json().get("ready_after_s"), "exit_code": code,
            "loadavg": loadavg()[0]}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    m = load(MODEL)
    store = Path(tempfile.mkdtemp(prefix="llmserve-store-", dir="/tmp"))
    logs = Path(tempfile.mkdtemp(prefix="llmserve-startup-logs-", dir="/tmp"))
    out: dict[str, Any] = {"cold": [], "warm, spawned": [], "warm, forked": []}
    try:
        dst = store / MODEL
        dst.mkdir()
        shutil.copy2(m.source, dst / m.source.name)
        shutil.copy2(m.source.parent / "manifest.json", dst / "manifest.json")
        engine_args = ["--model", MODEL, "--model-store", str(store), "--threads", str(args.threads)]
        spawned = LocalProvider(LocalProviderConfig(log_dir=str(logs / "spawned"), fork_from_template=False))
        forked = LocalProvider(LocalProviderConfig(log_dir=str(logs / "forked")))
        try:
            assert forked.template is not None
            await asyncio.to_thread(forked.template.wait_ready, 120)
            out["template_preload_s"] = forked.template.preload_s
            plan = [("cold", spawned)] + [("warm, spawned", spawned), ("warm, forked", forked)] * args.reps
            for i, (kind, provider) in enumerate(plan):
                res = await start_to_ready(provider, f"s{i}", engine_args)
                out[kind].append(res)
                print(f"  {kind}: {res['start_to_ready_s']:.2f} s to /ready 200 "
                      f"(server says {res['server_ready_after_s']:.2f}; exit {res['exit_code']})", flush=True)
        finally:
            await spawned.close()
            await forked.close()
    finally:
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="warm starts of each kind, alternating")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    info = machine()
    out = asyncio.run(run(args))
    rows = [[kind, i + 1, x["start_to_ready_s"], x["server_ready_after_s"], x["exit_code"], f"{x['loadavg']:.2f}"]
            for kind in ("cold", "warm, spawned", "warm, forked") for i, x in enumerate(out[kind])]
    best = {k: min(x["start_to_ready_s"] for x in out[k]) for k in ("warm, spawned", "warm, forked")}
    md = md_table(["start", "#", "start → /ready 200 s", "server's ready_after_s", "exit code on stop",
                   "load avg"], rows)
    md += (f"\n\nThe template process took {out['template_preload_s']:.2f} s to import torch and the server, "
           f"once, before the first fork. Best warm start: spawned {best['warm, spawned']:.2f} s, forked "
           f"{best['warm, forked']:.2f} s (target ≤ 3 s). Exit code 0 on stop = the instance drained on SIGTERM.")
    md_path, _ = write_results("startup", False, command_line(), info, [("Start-to-ready", md)], out)
    print(md)
    print(f"wrote {md_path}")


if __name__ == "__main__":
    main()
