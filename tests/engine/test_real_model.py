"""The real SmolLM2-135M-Instruct file: our loader + model against transformers' own GGUF loading."""

from __future__ import annotations

import pytest
import torch

from llmserve.engine.llm import LLM
from llmserve.engine.sampling_params import SamplingParams
from tests.kernel_gate import require_kernels

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name,
                                             dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="module", params=["fp32", "int8 exact", "int8"])
def llm(request, smollm2_path, model_store):
    """fp32; int8's lossless path (fp32 prefill, two-byte decode activations); int8's default."""
    return LLM(str(smollm2_path), model_store=str(model_store), max_num_seqs=8, num_kv_blocks=256,
               dtype=request.param.split()[0], exact_activations=request.param.endswith("exact"))


def test_auto_picks_int8_for_the_q4_gguf(smollm2_path, model_store):
    from llmserve.models import kernels

    auto = LLM(str(smollm2_path), model_store=str(model_store), max_num_seqs=2, num_kv_blocks=16)
    assert auto.engine.config.dtype == ("int8" if kernels.cpu_supported() else "fp32")


def _generate(llm, ids: list[int], n: int, logprobs: int):
    eng = llm.engine
    eng.add_request("x", ids, SamplingParams(max_tokens=n, temperature=0, logprobs=logprobs, ignore_eos=True))
    out = None
    while eng.has_unfinished():
        for o in eng.step():
            out = o
    return out.outputs[0]


# Per-logprob bounds hold only where nothing rounds activations coarsely: fp32 differs
# from transformers by summation order alone (at most 2.0e-5 over these 16 positions x
# top 5 on a 2-core EPYC: a 100x margin), and int8's exact mode rounds decode activations
# into two bytes, a relative error near 2^-11 (at most 3.4e-3 there: a 4x margin). The
# default int8 path rounds into one byte per 32 values, and a near-tie of two activations
# can round either way on another CPU or thread count (0.125 on one machine, 0.149 on
# another, against a 0.1 bound measured on a third): it is judged the way the field
# judges lossy formats, by top-k membership here (vLLM's check_logprobs_close) and by
# teacher-forced top-1 agreement and perplexity on held-out text
# (test_int8_default_meets_the_quality_bar_on_held_out_text). Greedy equality for the
# other two: the reference's smallest top-1 / top-2 gap here is 0.047, 14x exact's error.
LOGPROB_TOL = {"fp32": 2e-3, "int8 exact": 1.5e-2}


def test_logits_match_transformers(llm, hf_model):
    tok = llm.get_tokenizer()
    ids = tok.encode_chat([{"role": "user", "content": "Name three colours of the rainbow."}])
    out = _generate(llm, ids, 16, logprobs=5)
    with torch.no_grad():  # transformers teacher-forced along our tokens: its logprobs at each position
        ref = torch.log_softmax(hf_model(torch.tensor([ids + out.token_ids[:-1]])).logits[0, len(ids) - 1:], -1)
    cfg = llm.engine.config
    mode = cfg.dtype + (" exact" if cfg.exact_activations else "")
    for pos, (chosen, step) in enumerate(zip(out.token_ids, out.logprobs)):
        ours = [t for t, _ in step.top]
        theirs = torch.topk(ref[pos], 5).indices.tolist()
        # Each side's choice is among the other's top 5, at every position (lossy or not).
        assert chosen in theirs and theirs[0] in ours, f"position {pos}: ours {ours}, transformers {theirs}"
        if mode in LOGPROB_TOL:
            assert chosen == theirs[0], f"position {pos}: greedy token differs"
            for t, lp in step.top:
                assert lp == pytest.approx(float(ref[pos, t]), abs=LOGPROB_TOL[mode])


def test_greedy_chat_equals_transformers(llm, hf_model):
    if llm.engine.config.dtype == "int8" and not llm.engine.config.exact_activations:
        pytest.skip("int8's default rounds activations: held to the quality bar instead (below)")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = llm.get_tokenizer().encode_chat(msgs)
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    out = llm.chat(msgs, SamplingParams(max_tokens=24, temperature=0))[0]
    n = len(out.token_ids)
    # int8 holds this file's Q4_1 / Q8_0 weights exactly; exact mode prefills in fp32 and
    # rounds decode activations into two bytes: greedy-equal on this chat.
    assert out.token_ids == ref[:n]
    assert "Paris" in out.text


def test_a_poisoned_request_fails_alone(llm, monkeypatch):
    """Issue 17 on the real model: three greedy chats and one whose logits turn NaN mid-stream."""
    from tests.engine.faults import poison_logits

    tok, eng = llm.get_tokenizer(), llm.engine
    questions = ["What is the capital of France?", "Name a primary colour.", "Count from one to five."]
    prompts = [tok.encode_chat([{"role": "user", "content": q}]) for q in questions]
    poison = tok.encode_chat([{"role": "user", "content": "Tell me a short story."}])
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    def run(tag: str, with_poison: bool) -> dict:
        for i, p in enumerate(prompts):
            eng.add_request(f"{tag}{i}", p, sp, cache_salt=tag)  # (own salt: no prefix hits across runs)
        if with_poison:
            eng.add_request(f"{tag}-poison", poison, sp, cache_salt=tag)
        finals = {}
        while eng.has_unfinished():
            finals.update({o.request_id: o for o in eng.step() if o.finished})
        return finals

    baseline = run("base", False)
    shared = poison_logits(eng, monkeypatch, lambda r: r.prompt_token_ids == poison, after_tokens=4)
    finals = run("poisoned", True)
    assert finals["poisoned-poison"].finish_reason == "error" and "not finite" in finals["poisoned-poison"].error
    assert shared and all(len(b) == 4 for b in shared)
    assert [finals[f"poisoned{i}"].token_ids for i in range(3)] == [baseline[f"base{i}"].token_ids for i in range(3)]
    assert eng.kv.usage == 0.0


def test_int8_default_meets_the_quality_bar_on_held_out_text(smollm2_path, model_store):
    """Issue 21's bar for the shipped int8 configuration (the kernel on every row, one-byte
    activations on every kind, qkv and gate_up less their outlier channels found on the
    engine's calibration text, fp16 KV): teacher-forced top-1 >= 98 % of fp32's and
    perplexity within +0.5 %, on text no calibration used (benchmarks/activation_quality.py)."""
    import math
    import os
    from pathlib import Path

    from llmserve.models.llama import LlamaForCausalLM
    from llmserve.models.model_source import load_tokenizer, load_weights
    from llmserve.models.perplexity import teacher_forced
    from llmserve.models import outliers
    from llmserve.models.quant import WeightOnlyInt8Linear, round_activations
    from llmserve.models.weights import linear_factory_for

    require_kernels()
    mc, w = load_weights(smollm2_path, model_store)
    tokenizer = load_tokenizer(smollm2_path, model_store)
    text = (Path(os.__file__).parent / "idlelib" / "NEWS2x.txt").read_text()
    ids = tokenizer.encode(text)[:1025]
    ref_nll, ref_top = teacher_forced(LlamaForCausalLM(mc, w, linear_factory_for("fp32")), ids)
    model = LlamaForCausalLM(mc, w, linear_factory_for("int8"))  # (no unpacking: the kernel on every row)
    round_activations(model)
    outliers.split(model, outliers.calibration_ids(tokenizer))
    assert all(not layer.FINE for layers in model.linears_by_kind().values() for layer in layers
               if isinstance(layer, WeightOnlyInt8Linear) and not layer.RESCORE)
    nll, top = teacher_forced(model, ids, kv_dtype=torch.float16)
    print(f"top-1 {float((top == ref_top).double().mean()):.4f}, perplexity "
          f"{math.exp(float(nll.mean())) / math.exp(float(ref_nll.mean())) - 1:+.4f}")
    assert float((top == ref_top).double().mean()) >= 0.98
    assert math.exp(float(nll.mean())) <= 1.005 * math.exp(float(ref_nll.mean()))
