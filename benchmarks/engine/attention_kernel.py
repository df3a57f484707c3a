"""Decode attention kernel at batch 64, optionally against another build of it.

    python benchmarks/engine/attention_kernel.py
    python benchmarks/engine/attention_kernel.py --baseline ~/.cache/torch_extensions/py311_cpu/llmserve_kernels_<hash>

SmolLM2's shapes (9 query heads, 3 KV heads, dim 64), 64 sequences whose contexts sit
in scattered 16-slot blocks of a pool as large as an engine's, six layers' pools so
that nothing stays cached between calls. With ``--baseline`` (the build folder of
other kernel sources, e.g. an older commit's), the two builds take turns, their outputs
are checked equal, and the median per-layer times are compared.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import time

import torch


def load_so(folder: str):
    path = glob.glob(f"{folder}/*.so")[0]
    spec = importlib.util.spec_from_file_location(path.rsplit("/", 1)[1].split(".")[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", help="build folder of another kernels build")
    ap.add_argument("--contexts", default="136,256")
    args = ap.parse_args()
    from llmserve.models import kernels

    builds = {"this": kernels.load()}
    if args.baseline:
        builds["baseline"] = load_so(args.baseline)
    torch.manual_seed(0)
    B, H, KVH, D, S = 64, 9, 3, 64, 16 * 12000
    q = torch.randn(B, H, D)
    for L in (int(x) for x in args.contexts.split(",")):
        nb = -(-L // 16)
        blocks = torch.randperm(S // 16)[: B * nb].view(B, nb)
        idx = (blocks[:, :, None] * 16 + torch.arange(16)).view(B, -1)[:, :L].contiguous()
        lens = torch.full((B,), L, dtype=torch.long)
        for dt in (torch.float16, torch.float32):
            pools = [(torch.randn(S, KVH, D).to(dt), torch.randn(S, KVH, D).to(dt)) for _ in range(6)]
            outs = [m.paged_decode_attention(q, *pools[0], idx, lens, 0.125) for m in builds.values()]
            assert all(torch.equal(outs[0], o) for o in outs[1:]), "the builds disagree"
            times: dict[str, list[float]] = {name: [] for name in builds}
            for rnd in range(6):
                order = list(builds.items())
                for name, m in (order if rnd % 2 else order[::-1]):
                    t = time.perf_counter()
                    for _ in range(5):
                        for kc, vc in pools:
                            m.paged_decode_attention(q, kc, vc, idx, lens, 0.125)
                    times[name].append((time.perf_counter() - t) / (5 * len(pools)) * 1e3)
            med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            line = f"context {L}, {str(dt).removeprefix('torch.')} pool: " + \
                ", ".join(f"{k} {v:.3f} ms a layer" for k, v in med.items())
            if "baseline" in med:
                line += f", this / baseline {med['this'] / med['baseline']:.2f}"
            print(line, flush=True)
            del pools


if __name__ == "__main__":
    main()
