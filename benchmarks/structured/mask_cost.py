"""xgrammar against llguidance on SmolLM2's 49k vocabulary: what one token mask costs.

Both libraries get the same tokenizer (llmserve's wrapper of the HF ``tokenizers``
object), the same grammars and the same token sequences (valid outputs, tokenized
by the model's tokenizer), and are timed interleaved, one library then the other,
``--reps`` times. Per generated token we time "fill the next-token bitmask" and
"accept the sampled token" separately, for one sequence (c = 1) and for 16 at once
(c = 16: a loop over matchers, and each library's own batch call).

    python benchmarks/structured/mask_cost.py [--reps 5] [--store DIR]

Prints a markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

SCHEMAS = {
    "person (2 keys)": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                         "required": ["name", "age"], "additionalProperties": False},
                        {"name": "Ada Lovelace", "age": 36}),
    "tool call (nested)": ({"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city", "unit"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False},
        {"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius", "days": 3}}),
    "any JSON object": (None, {"title": "Notes", "items": [1, 2.5, True, None], "meta": {"by": "me"}}),
}


def load_tokenizer(store: Path):
    from llmserve.models.model_source import load_tokenizer as load
    from llmserve.models.store import resolve

    return load(resolve("SmolLM2-135M-Instruct", store), store)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, vocab: int) -> None:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgr
        t0 = time.perf_counter()
        hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
        self.info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=list(tok.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.setup_s = time.perf_counter() - t0
        self.vocab = vocab
        self.batch = xgr.BatchGrammarMatcher(max_threads=2)

    def compile(self, schema):
        if schema is None:
            return self.compiler.compile_builtin_json_grammar()
        return self.compiler.compile_json_schema(json.dumps(schema))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def bitmask(self, n):
        return self.xgr.allocate_token_bitmask(n, self.vocab)

    def fill(self, m, mask, i):
        m.fill_next_token_bitmask(mask, i)

    def fill_batch(self, ms, mask):
        self.batch.batch_fill_next_token_bitmask(ms, mask)

    def accept(self, m, t):
        assert m.accept_token(t), t


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, vocab: int) -> None:
        import llguidance
        import llguidance.torch as lt

        self.ll, self.lt = llguidance, lt
        t0 = time.perf_counter()
        self.tok = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=vocab, eos_token=list(tok.eos_token_ids))
        self.setup_s = time.perf_counter() - t0
        self.vocab = vocab
        self.executor = llguidance.LLExecutor(num_threads=2)

    def compile(self, schema):
        return self.ll.LLMatcher.grammar_from_json_schema(schema if schema is not None else {"type": "object"})

    def matcher(self, grammar):
        m = self.ll.LLMatcher(self.tok, grammar, log_level=0)
        assert not m.is_error(), m.get_error()
        return m

    def bitmask(self, n):
        return self.lt.allocate_token_bitmask(n, self.vocab)

    def fill(self, m, mask, i):
        self.lt.fill_next_token_bitmask(m, mask, i)

    def fill_batch(self, ms, mask):
        self.lt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(ms)], mask)

    def accept(self, m, t):
        assert m.consume_token(t), (t, m.get_error())


def run_one(lib, compiled, tokens: list[int], c: int, batched: bool) -> tuple[list[float], list[float]]:
    """Per-token seconds: (fill for all c rows, accept for all c rows)."""
    ms = [lib.matcher(compiled) for _ in range(c)]
    mask = lib.bitmask(c)
    fills, accepts = [], []
    for t in tokens:
        t0 = time.perf_counter()
        if batched:
            lib.fill_batch(ms, mask)
        else:
            for i, m in enumerate(ms):
                lib.fill(m, mask, i)
        t1 = time.perf_counter()
        for m in ms:
            lib.accept(m, t)
        t2 = time.perf_counter()
        fills.append(t1 - t0)
        accepts.append(t2 - t1)
    return fills, accepts


def apply_cost(vocab: int, c: int, reps: int = 200) -> float:
    """Seconds to apply a packed bitmask to c rows of fp32 logits (llmserve's kernel)."""
    from llmserve.engine.grammar import apply_bitmask

    logits = torch.randn(c, vocab)
    mask = torch.full((c, (vocab + 31) // 32), -1, dtype=torch.int32)
    mask[:, ::3] = 0x0F0F0F0F
    rows = list(range(c))
    for _ in range(5):
        apply_bitmask(logits, mask, rows)
    t0 = time.perf_counter()
    for _ in range(reps):
        apply_bitmask(logits, mask, rows)
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--store", default=os.environ.get("LLMSERVE_MODEL_STORE"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    from llmserve.models.store import default_store_dir

    tok = load_tokenizer(Path(args.store) if args.store else default_store_dir())
    vocab = 49152
    libs = [XGrammar(tok, vocab), LLGuidance(tok, vocab)]
    print(f"load average {os.getloadavg()[0]:.1f}; vocab {vocab}; tokenizer info built in "
          + ", ".join(f"{lib.name} {lib.setup_s * 1e3:.0f} ms" for lib in libs))
    rows = []
    for title, (schema, example) in SCHEMAS.items():
        tokens = tok.encode(json.dumps(example), add_special_tokens=False) + [tok.eos_token_ids[0]]
        stats: dict = {}
        for rep in range(args.reps):
            for lib in (libs if rep % 2 == 0 else libs[::-1]):
                t0 = time.perf_counter()
                compiled = lib.compile(schema)
                lib.matcher(compiled)
                compile_s = time.perf_counter() - t0
                s = stats.setdefault(lib.name, {"compile": [], "c1": [], "c1a": [], "c16": [], "c16b": [],
                                                "c16a": []})
                s["compile"].append(compile_s)
                f, a = run_one(lib, compiled, tokens[:-1], 1, False)
                s["c1"] += f
                s["c1a"] += a
                f, a = run_one(lib, compiled, tokens[:-1], 16, False)
                s["c16"] += f
                s["c16a"] += a
                f, _ = run_one(lib, compiled, tokens[:-1], 16, True)
                s["c16b"] += f
        for name, s in stats.items():
            med = {k: statistics.median(v) for k, v in s.items()}
            p99 = sorted(s["c1"])[int(0.99 * (len(s["c1"]) - 1))]
            rows.append((title, len(tokens) - 1, name, med["compile"] * 1e3, med["c1"] * 1e6, p99 * 1e6,
                         med["c1a"] * 1e6, med["c16"] * 1e6, med["c16b"] * 1e6, med["c16a"] * 1e6))
    print("\n| grammar | tokens | library | compile ms | fill c=1 µs (p50) | fill c=1 µs (p99) | accept c=1 µs "
          "| fill c=16 loop µs | fill c=16 batch call µs | accept c=16 µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {r[4]:.0f} | {r[5]:.0f} | {r[6]:.0f} | {r[7]:.0f} "
              f"| {r[8]:.0f} | {r[9]:.0f} |")
    print(f"\napplying the bitmask to the logits (llmserve.engine.grammar.apply_bitmask): "
          f"c=1 {apply_cost(vocab, 1) * 1e6:.0f} µs, c=16 {apply_cost(vocab, 16) * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
