"""How long a long prompt takes to compute, alone and beside decoding streams, in process.

    python benchmarks/engine/long_prompt.py [--lengths 2000,4000,8000] [--streams 0,1]

For each length, a prompt of random token ids (no prefix hit) is added to an engine at its
defaults (int8, time-aware chunks) with ``streams`` requests already decoding, and stepped
until its first token: the seconds, the steps it took, and the decode streams' longest gap
between two steps. Random ids, so the prompt's length is what the tokenizer would give.
"""

from __future__ import annotations

import argparse
import random
import time

from common import load, md_table, prefill_all

from llmserve.engine.sampling_params import SamplingParams


def one(loaded, length: int, streams: int, seed: int) -> dict:
    core = loaded.core(dtype="int8", max_model_len=max(8192, length + 16))
    rng = random.Random(seed)
    vocab = loaded.model_config.vocab_size
    for i in range(streams):  # decoding before the long prompt arrives
        core.add_request(f"s{i}", [rng.randrange(100, vocab) for _ in range(32)],
                         SamplingParams(max_tokens=4000, temperature=0, ignore_eos=True))
    prefill_all(core)
    core.step()
    prompt = [rng.randrange(100, vocab) for _ in range(length)]
    core.add_request("long", prompt, SamplingParams(max_tokens=1, temperature=0))
    start = last = time.perf_counter()
    steps, gap = 0, 0.0
    while "long" in core.scheduler.requests:
        core.step()
        now = time.perf_counter()
        steps, gap, last = steps + 1, max(gap, now - last), now
    return {"prompt tokens": length, "decoding streams": streams, "seconds": round(last - start, 2),
            "steps": steps, "longest step (ms)": round(1000 * gap, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2000,4000,8000")
    ap.add_argument("--streams", default="0,1")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    loaded = load()
    rows = [one(loaded, n, s, args.seed) for n in map(int, args.lengths.split(","))
            for s in map(int, args.streams.split(","))]
    print(md_table(list(rows[0]), [list(r.values()) for r in rows]))


if __name__ == "__main__":
    main()
