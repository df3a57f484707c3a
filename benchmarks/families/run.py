"""llmserve against llama.cpp on a Qwen3-shaped and a Gemma-3-shaped model (issue 30's target).

    python benchmarks/families/run.py --llama-server /root/.cache/llama-server-11434/build/bin/llama-server

Random weights in the shapes of real small models (Qwen3 at SmolLM2-135M's widths, the
issue's "size of SmolLM2"; Gemma 3 at gemma-3-270m's widths, sliding window and layer
pattern), built with transformers' own config classes, quantized to Q4_1 by the ``gguf``
package (this llama.cpp build has no ``llama-quantize``) and written with llama.cpp's
metadata and tensor names (``tests/family_gguf.py``). Both carry SmolLM2's tokenizer
(vocab 49,152) so the files serve: gemma-3-270m's own 262k vocabulary is not on this
machine. Each file is then served by both servers over HTTP, driven by
``benchmarks/peers/run.py`` (same prompts, same threads, servers alternating).
Results: ``benchmarks/families/<family>.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

SMOLLM2 = Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB = 49152
SHAPES = {
    # Qwen3 at SmolLM2-135M's widths (30 layers, 576 wide, 9 heads over 3 KV heads)
    "qwen3": dict(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                  rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # gemma-3-270m's config.json, but for the vocabulary
    "gemma3": dict(vocab_size=VOCAB, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                   sliding_window=512, max_position_embeddings=32768, rms_norm_eps=1e-6, layer_types=None,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
}


def build(family: str, work: Path) -> Path:
    from tests.family_gguf import write_gguf
    from tests.family_models import make_family

    out = work / f"{family}-Q4_1.gguf"
    if out.exists():  # built by an earlier run in the same --work folder
        return out
    folder = work / f"{family}-hf"
    make_family(family, folder, **SHAPES[family])
    return write_gguf(folder, out, "Q4_1", tokenizer_from=SMOLLM2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--families", nargs="+", default=list(SHAPES))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of every level (the table adds their medians)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the model files (kept, reused)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="families-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    for family in args.families:
        gguf = build(family, work)
        print(f"{family}: {gguf} ({gguf.stat().st_size / 1e6:.0f} MB)", flush=True)
        cmd = [sys.executable, str(ROOT / "benchmarks/peers/run.py"), "--llama-server", args.llama_server,
               "--gguf", str(gguf), "--threads", str(args.threads), "--skip-hol", "--scale", str(args.scale),
               "--output-len", str(args.output_len), "--rounds", str(args.rounds),
               "--concurrency", *map(str, args.concurrency), "--results", str(HERE / f"{family}.md")]
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
