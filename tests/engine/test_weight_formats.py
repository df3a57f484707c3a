"""Each weight format on the engine: fp32 exact (elsewhere), bf16 and int8 within tolerance."""

from __future__ import annotations

import pytest

from llmserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import run_to_completion


@pytest.mark.parametrize("fmt,tol", [("bf16", 0.05), ("int8", 0.15)])
def test_logits_close_to_fp32(tiny, fmt, tol):
    prompt = list(range(5, 40))
    lps = {}
    for f in ("fp32", fmt):
        eng = tiny.engine(dtype=f, num_kv_blocks=64)
        eng.add_request("x", prompt, SamplingParams(max_tokens=1, temperature=0, logprobs=20))
        out = None
        while eng.has_unfinished():
            for o in eng.step():
                out = o
        lps[f] = dict(out.outputs[0].logprobs[0].top)
    ref, got = lps["fp32"], lps[fmt]
    common = set(ref) & set(got)
    assert len(common) >= 15  # the top-20 sets mostly agree
    err = max(abs(ref[t] - got[t]) for t in common)
    assert err < tol * max(abs(v) for v in ref.values())


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_formats_run_the_full_engine(tiny, fmt):
    eng = tiny.engine(dtype=fmt, num_kv_blocks=32, block_size=4, max_num_batched_tokens=8)
    for i in range(3):
        eng.add_request(str(i), [1 + i] * (5 + 7 * i), SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    done = run_to_completion(eng)
    assert all(len(v) == 10 for v in done.values())
    assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_unknown_format_is_rejected(tiny):
    with pytest.raises(ValueError, match="dtype"):
        tiny.engine(dtype="fp8")
