"""How many bits the head's rounded activations need: its one-byte product emulated in fp32.

    python benchmarks/head_activation_bits.py [--bits 8,7] [--tokens 8000]

Activation_quality.py's bar and held-out text. The head's product on activations rounded per
32 to ``b`` bits (absmax scaling, ``2^(b-1) - 1`` steps a side), as an fp32 product on the
dequantized weights (the int8 kernel's integers up to the float order of its sums), then
each row's 8 largest logits recomputed exactly, as the engine does; every other layer as the
engine runs it (one byte less its outlier channels). ``--bits 8`` is the control: it must give
the kernel's own figures. Fewer bits would let the AVX2 dot of the 8-bit head skip its sign
fix-ups (``w + 128`` unsigned times 7-bit activations cannot saturate an int16 pair).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import activation_quality as aq  # noqa: E402

from llmserve.models.quant import WeightOnlyInt8Linear  # noqa: E402

BITS = {"n": 8}
_call = WeightOnlyInt8Linear.__call__


def _rounded_head(self, x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, self.in_features).float()
    if not (self.RESCORE and not self.FINE and x2.shape[0] >= self.RESCORE_MIN_ROWS and self.dense is not None):
        return _call(self, x)
    top = 2 ** (BITS["n"] - 1) - 1
    g = x2.view(x2.shape[0], -1, 32)
    d = (g.abs().amax(-1, keepdim=True) / top).clamp(min=1e-30)
    xq = (torch.round(g / d).clamp(-top, top) * d).view_as(x2)
    return self._rescored(x2, F.linear(xq, self.dense)).reshape(*x.shape[:-1], self.out_features)


def main() -> None:
    from llmserve.models.llama import LlamaForCausalLM
    from llmserve.models.model_source import load_tokenizer, load_weights
    from llmserve.models.outliers import calibration_ids
    from llmserve.models.perplexity import teacher_forced
    from llmserve.models.store import default_store_dir, resolve
    from llmserve.models.weights import linear_factory_for

    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="8,7")
    ap.add_argument("--tokens", type=int, default=8000)
    args = ap.parse_args()
    torch.set_num_threads(2)
    WeightOnlyInt8Linear.__call__ = _rounded_head
    store = default_store_dir()
    source = resolve("SmolLM2-135M-Instruct", store)
    mc, w = load_weights(source, store)
    tokenizer = load_tokenizer(source, store)
    ids = tokenizer.encode(aq.TEXT.read_text())[:args.tokens + 1]
    ref_nll, ref_top = teacher_forced(LlamaForCausalLM(mc, w, linear_factory_for("fp32")), ids)
    ref = math.exp(float(ref_nll.mean()))
    model = LlamaForCausalLM(mc, w, linear_factory_for("int8", exact=True))
    for config in aq.DEFAULT[-1:]:
        for bits in (int(b) for b in args.bits.split(",")):
            BITS["n"] = bits
            aq.configure(model, config, calibration_ids(tokenizer))
            nll, top = teacher_forced(model, ids, kv_dtype=torch.float16)
            ppl = math.exp(float(nll.mean()))
            agree = float((top == ref_top).double().mean())
            print(f"the default, head at {bits} bits: top-1 {100 * agree:.2f} %, perplexity {100 * (ppl / ref - 1):+.2f} % "
                  f"({'meets' if agree >= aq.BAR_TOP1 and ppl / ref - 1 <= aq.BAR_PPL else 'fails'} the bar)", flush=True)


if __name__ == "__main__":
    main()
