"""Where the time of speculative decoding goes (issue 37), in one process, interleaved.

    python benchmarks/engine/spec_cost.py [--reps 30] [--batches 1,4,16] [--texts 3]

1. Verification cost: the forward pass (``ModelRunner.execute``) of B decoding
   requests that each score 1 + k rows, against the same B requests at k = 0; every
   (B, k) is timed in turn, round after round, so a shared machine's load falls on all,
   and on CPUs with AVX-512 VNNI once per int8 path (``csrc/qdot_vnni.cpp``, the
   default, and the AVX2 one), the two interleaved. ``--threads``: torch's threads for it.
2. The copy task (the answer repeats a given paragraph; chat template, greedy, 120
   tokens) with the engine's speculation and without: tokens/s, steps, acceptance
   rate, mean accepted length per draft, the proposer's own time per step, and
   whether the outputs are identical.

Results: ``benchmarks/results/spec_cost.{md,json}``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
from common import EngineCore, command_line, greedy, load, machine, md_table, write_results
from speculative import PROSE

from llmserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from llmserve.models import kernels

COPY = "Repeat the following paragraph exactly, word for word, and output nothing else.\n\n"


def copy_prompts(tok: Any, n: int) -> list[list[int]]:
    return [tok.encode_chat([{"role": "user", "content": COPY + text}], add_generation_prompt=True)
            for text in PROSE[:n]]


def int8_paths() -> list[str]:
    """The int8 kernel's paths this CPU has: the VNNI one (the default) where it can run."""
    module = kernels.load()
    return ["vnni", "avx2"] if module is not None and module.int8_vnni(True) else ["avx2"]


def verify_cost(core: EngineCore, prompt: list[int], batches: list[int], ks: list[int],
                reps: int) -> dict[tuple[str, int, int], list[float]]:
    """Seconds of ``execute`` per (int8 path, B, k); the drafts are the requests' last k tokens."""
    reqs = []
    for i in range(max(batches)):
        rid = f"verify-{i}"
        core.add_request(rid, prompt[i:] + prompt[:i], greedy(512, ignore_eos=True))
        reqs.append(rid)
    while any(core.scheduler.requests[r].num_output_tokens < 2 for r in reqs):
        core.step()
    live = [core.scheduler.requests[r] for r in reqs]
    for r in live:
        assert core.kv.allocate_slots(r, 1 + max(ks))

    def plan(b: int, k: int) -> SchedulerOutput:
        return SchedulerOutput([ScheduledRequest(r, 1, r.all_token_ids[-k:] if k else [], True)
                                for r in live[:b]], [], b * (1 + k))

    paths = int8_paths()
    times: dict[tuple[str, int, int], list[float]] = {(p, b, k): [] for p in paths for b in batches for k in ks}
    cells = list(times)
    for rep in range(reps):
        for p, b, k in cells if rep % 2 == 0 else cells[::-1]:
            if len(paths) > 1:
                kernels.load().int8_vnni(p == "vnni")
            t = time.perf_counter()
            core.runner.execute(plan(b, k))
            times[(p, b, k)].append(time.perf_counter() - t)
    if len(paths) > 1:
        kernels.load().int8_vnni(True)
    for r in reqs:
        core.abort_request(r)
    return times


def run_copy(core: EngineCore, prompt: list[int], max_tokens: int, tag: str) -> dict[str, Any]:
    assert core.kv.reset_prefix_cache()
    spent = [0.0]
    spec = core.spec
    if spec is not None:
        inner = spec.proposer.propose

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        spec.proposer.propose = timed
    c0 = (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) if spec else (0, 0, 0)
    t0 = time.monotonic()
    core.add_request(tag, prompt, greedy(max_tokens, ignore_eos=True), arrival_time=t0)
    steps, final = 0, None
    while core.has_unfinished():
        for out in core.step():
            if out.finished:
                final = out
        steps += 1
    wall = time.monotonic() - t0
    c1 = (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) if spec else (0, 0, 0)
    if spec is not None:
        spec.proposer.propose = inner
    return {"wall": wall, "steps": steps, "tokens": len(final.token_ids), "token_ids": final.token_ids,
            "ttft": final.metrics.first_token_time - t0, "proposer_s": spent[0],
            "drafts": c1[0] - c0[0], "draft_tokens": c1[1] - c0[1], "accepted": c1[2] - c0[2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--ks", default="0,1,3,5,7")
    ap.add_argument("--texts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="copy-task rounds per text (engines alternate)")
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--threads", type=int, help="torch threads for part 1 (default: the engine's)")
    args = ap.parse_args()
    info = machine()
    m = load()
    cores = {"speculation (defaults)": m.core(), "without": m.core(speculative_config=None)}
    prompts = copy_prompts(m.tokenizer, args.texts)
    batches = [int(x) for x in args.batches.split(",")]
    ks = [int(x) for x in args.ks.split(",")]

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    times = verify_cost(cores["without"], prompts[0], batches, ks, args.reps)
    torch.set_num_threads(threads)
    vrows, vdata = [], []
    for p, b in dict.fromkeys((p, b) for p, b, _ in times):
        base, low = np.median(times[(p, b, 0)]), np.min(times[(p, b, 0)])
        for k in ks:
            t = np.array(times[(p, b, k)])
            vrows.append([p, b, k, b * (1 + k), f"{np.median(t) * 1e3:.1f}", f"{np.min(t) * 1e3:.1f}",
                          f"{np.median(t) / base:.2f}x", f"{np.min(t) / low:.2f}x"])
            vdata.append({"int8": p, "batch": b, "k": k, "median_ms": np.median(t) * 1e3, "min_ms": np.min(t) * 1e3})
        print(vrows[-len(ks):], flush=True)

    names = list(cores)
    for c in cores.values():  # warm-up
        run_copy(c, prompts[-1], 8, "warm")
    crows, cdata = [], []
    for j, p in enumerate(prompts):
        res: dict[str, list] = {n: [] for n in names}
        for rnd in range(args.rounds):
            for n in names if (j + rnd) % 2 == 0 else names[::-1]:
                res[n].append(run_copy(cores[n], p, args.max_tokens, f"copy-{j}-{rnd}-{n}"))
        s, w = res[names[0]], res[names[1]]
        same = all(a["token_ids"] == b["token_ids"] for a, b in zip(s, w))
        tps = {n: [r["tokens"] / r["wall"] for r in res[n]] for n in names}
        sp = s[0]
        row = {"text": j, "tok_s_spec": tps[names[0]], "tok_s_without": tps[names[1]], "identical": same,
               "steps_spec": sp["steps"], "steps_without": w[0]["steps"], "acceptance": sp["accepted"] / max(1, sp["draft_tokens"]),
               "mean_accepted": sp["accepted"] / max(1, sp["drafts"]), "drafts": sp["drafts"],
               "proposer_ms_per_step": sp["proposer_s"] / sp["steps"] * 1e3, "prompt_tokens": len(p)}
        cdata.append(row)
        ratio = np.median(tps[names[0]]) / np.median(tps[names[1]])
        crows.append([j, len(p), f"{np.median(tps[names[1]]):.1f}", f"{np.median(tps[names[0]]):.1f}", f"{ratio:.2f}x",
                      f"{w[0]['steps']} → {sp['steps']}", f"{row['acceptance']:.0%}", f"{row['mean_accepted']:.2f}",
                      f"{row['proposer_ms_per_step']:.3f}", "yes" if same else "NO"])
        print(crows[-1], flush=True)

    vt = md_table(["int8 path", "batch", "k (drafts per request)", "rows", "execute median ms", "min ms",
                   "median vs k = 0", "min vs k = 0"], vrows)
    ct = md_table(["text", "prompt tokens", "tok/s without", "tok/s with", "ratio", "steps without → with",
                   "acceptance", "accepted per draft", "proposer ms/step", "identical"], crows)
    md, _ = write_results("spec_cost", False, command_line(), info,
                          [("Verification step cost (forward pass only)", vt),
                           (f"Copy task, greedy, {args.max_tokens} tokens, one stream, in process", ct)],
                          {"verify": vdata, "copy": cdata})
    print(md.read_text())


if __name__ == "__main__":
    main()
