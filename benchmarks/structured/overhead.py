"""What a grammar costs per output token on SmolLM2, at c = 1 and c = 16 (issue 22).

Each variant decodes c requests x 64 tokens on one engine, interleaved with the
others, ``--reps`` times:

- plain: no grammar (ignore_eos, so every request makes 64 tokens);
- json schema: an array of >= 40 integers (the grammar cannot end before 64 tokens);
- tools auto: free text under the tool-call structural tag (triggered_tags: the
  grammar is live on every token), EOS banned with logit_bias.

The grammar's share of each step is timed where it can hold the engine thread up:
``start`` (submitting the mask job), ``masks`` (waiting for it after the forward),
the mask and bias applied in ``constrain``, and ``commit``. The mask filling itself
runs in the worker thread during the forward; its time is shown beside the
forward's, to show whether it hides behind it. TPOT is decode time per token.

    python benchmarks/structured/overhead.py [--reps 2] [--tokens 64]

Writes benchmarks/results/structured_overhead.{md,json}; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from common import MODEL, Loaded, command_line, machine, md_table, write_results  # noqa: E402

import llmserve.engine.sampler as sampler_mod  # noqa: E402
from llmserve.engine.guided import GuidedDecoding  # noqa: E402
from llmserve.engine.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from llmserve.server.tool_calls import call_grammar  # noqa: E402

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ARRAY = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 40}


class Timers:
    """Wraps the grammar's engine-thread calls (and the forward) with timers."""

    def __init__(self, core) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self.core = core
        self._undo = []

    def wrap(self, owner, name: str, key: str) -> None:
        fn = getattr(owner, name)
        t = self.t

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                t[key] += time.perf_counter() - t0

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def __enter__(self) -> "Timers":
        g = self.core.guided
        for name in ("start", "commit", "_fill"):
            self.wrap(g, name, name)
        self.wrap(GuidedDecoding, "masks", "masks")
        self.wrap(sampler_mod, "constrain", "constrain")
        self.wrap(self.core.runner, "execute", "forward")
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, fn in reversed(self._undo):
            if owner is GuidedDecoding or owner is sampler_mod:
                setattr(owner, name, fn)
            else:
                delattr(owner, name)


def params(variant: str, tokens: int, eos: int, seed: int) -> SamplingParams:
    if variant == "plain":
        return SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed, ignore_eos=True)
    if variant == "json schema":
        return SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed, ignore_eos=True,
                              structured_outputs=StructuredOutputsParams(json=ARRAY))
    return SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed, logit_bias={eos: -100.0},
                          structured_outputs=StructuredOutputsParams(
                              structural_tag=call_grammar([TOOL], "auto", True)))


def run(core, tok, variant: str, c: int, tokens: int, rep: int) -> dict:
    eos = tok.eos_token_ids[0]
    prompts = [tok.encode_chat([{"role": "user", "content": f"List some numbers, please ({i})."}]) for i in range(c)]
    for i, p in enumerate(prompts):
        sp = params(variant, tokens, eos, 1000 * rep + i)
        core.compile_grammar(sp)  # as the server does, off the step
        core.add_request(f"{variant}-{c}-{rep}-{i}", p, sp)
    steps, decode_s, first_all, n_tokens = 0, 0.0, None, 0
    with Timers(core) as tm:
        while core.has_unfinished():
            t0 = time.perf_counter()
            outs = core.step()
            dt = time.perf_counter() - t0
            n_tokens += sum(len(o.outputs[0].delta_token_ids) for o in outs)
            if first_all is not None:
                decode_s += dt
                steps += 1
            elif all(r.num_output_tokens > 0 for r in core.scheduler.running) and not core.scheduler.waiting:
                first_all = n_tokens
    grammar = tm.t["start"] + tm.t["masks"] + tm.t["commit"] + (tm.t["constrain"] if variant != "plain" else 0)
    return {"variant": variant, "c": c, "steps": steps, "decode_s": decode_s,
            "decode_tokens": n_tokens - (first_all or 0), "grammar_s": grammar, "wait_s": tm.t["masks"],
            "constrain_s": tm.t["constrain"], "fill_s": tm.t["_fill"], "forward_s": tm.t["forward"]}


def load(store: str | None) -> Loaded:
    from llmserve.models.model_source import load_tokenizer, load_weights
    from llmserve.models.store import default_store_dir, resolve

    folder = Path(store) if store else default_store_dir()
    source = resolve(MODEL, folder)
    model_config, weights = load_weights(source, folder)
    return Loaded(MODEL, model_config, weights, load_tokenizer(source, folder), Path(source), folder)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--store", default=os.environ.get("LLMSERVE_MODEL_STORE"), help="model store folder")
    args = ap.parse_args()
    info = machine()
    loaded = load(args.store)
    core = loaded.core(threads=1, max_num_seqs=16, max_num_batched_tokens=1024)
    tok = loaded.tokenizer
    variants = ["plain", "json schema", "tools auto"]
    core.compile_grammar(params("json schema", 4, 2, 0))  # builds the tokenizer info (once per engine)
    run(core, tok, "json schema", 2, 8, 99)  # warm-up
    samples = []
    for rep in range(args.reps):
        for c in (1, 16):
            for v in (variants if rep % 2 == 0 else variants[::-1]):
                samples.append(run(core, tok, v, c, args.tokens, rep))
                print(samples[-1], flush=True)
    rows = []
    for c in (1, 16):
        for v in variants:
            ss = [s for s in samples if s["c"] == c and s["variant"] == v]
            tpot = statistics.median(s["decode_s"] / s["steps"] for s in ss) * 1e3  # one token per request per step
            grammar = statistics.median(s["grammar_s"] / s["steps"] for s in ss) * 1e3
            wait = statistics.median(s["wait_s"] / s["steps"] for s in ss) * 1e3
            fill = statistics.median(s["fill_s"] / s["steps"] for s in ss) * 1e3
            fwd = statistics.median(s["forward_s"] / s["steps"] for s in ss) * 1e3
            plains = [s for s in samples if s["c"] == c and s["variant"] == "plain"]
            # Each rep runs the variants back to back: the ratio within a rep cancels slow drifts in load.
            paired = statistics.median((a["decode_s"] / a["steps"]) / (b["decode_s"] / b["steps"])
                                       for a, b in zip(ss, plains))
            rows.append([v, c, f"{tpot:.1f}", f"{grammar:.2f}", f"{100 * grammar / tpot:.1f} %" if v != "plain" else "-",
                         f"{wait:.2f}", f"{fill:.2f}", f"{fwd:.1f}",
                         f"{100 * (paired - 1):+.1f} %" if v != "plain" else "-"])
    table = md_table(["variant", "c", "TPOT ms", "grammar ms/step (engine thread)", "grammar / TPOT",
                      "of which waiting for masks ms", "mask fill ms/step (worker)", "forward ms/step",
                      "TPOT vs plain (median of per-rep ratios)"], rows)
    md, js = write_results("structured_overhead", False, command_line(), info, [("Grammar cost per token", table)],
                           {"samples": samples})
    print(table)
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()
