"""Measure the real engine's step times and fit the simulator's instance profile.

``llmserve calibrate`` drives the engine through prefill-only, decode-only and
mixed steps, logs ``(prefill_tokens, decode_seqs, sum_context, seconds)`` per step
and hands the rows to :func:`llmserve.sim.calibrate.calibrate`, so the capacity
simulator replays this machine's engine rather than placeholder numbers.
"""

from __future__ import annotations

import random
import time

from llmserve.engine.engine import EngineCore
from llmserve.engine.sampling_params import SamplingParams


def measure_steps(engine: EngineCore, *, prefill_sizes=(16, 64, 128, 256, 512),
                  decode_batches=(1, 4, 16, 32), decode_steps: int = 6, seed: int = 0
                  ) -> list[tuple[int, int, int, float]]:
    """Run calibration workloads; returns one row per engine step."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    engine.stats.step_log = []
    n = 0

    def prompt(length: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(length)]

    def step() -> None:
        # Time the whole step (schedule, forward, sample, outputs), not only the forward
        # the stats log times: the server runs them back to back, so a simulated step
        # must last all of it (about 15% more on a tiny model).
        log = engine.stats.step_log
        before = len(log)
        t0 = time.perf_counter()
        engine.step()
        if len(log) > before:
            log[-1] = (*log[-1][:3], time.perf_counter() - t0)

    def run() -> None:
        while engine.has_unfinished():
            step()

    budget = engine.config.max_num_batched_tokens
    for size in prefill_sizes:
        if size > budget or size >= engine.max_model_len:
            continue
        engine.add_request(f"cal-{n}", prompt(size), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        n += 1
        run()
    for b in decode_batches:
        if b > engine.config.max_num_seqs:
            continue
        for _ in range(b):
            engine.add_request(f"cal-{n}", prompt(rng.randrange(32, 256)),
                               SamplingParams(max_tokens=decode_steps, temperature=0, ignore_eos=True))
            n += 1
        run()
    # mixed: decodes running while a long prompt arrives in chunks
    for b in decode_batches[:2]:
        for _ in range(b):
            engine.add_request(f"cal-{n}", prompt(64), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
            n += 1
        step()
        engine.add_request(f"cal-{n}", prompt(min(2 * budget, engine.max_model_len - 2)),
                           SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        n += 1
        run()
    rows, engine.stats.step_log = engine.stats.step_log, None
    return [r for r in rows if r[0] + r[1] > 0]
