"""The real SmolLM2-135M-Instruct file: our loader + model against transformers' own GGUF loading."""

from __future__ import annotations

import pytest
import torch

from llmserve.engine.llm import LLM
from llmserve.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name,
                                             dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="module", params=["fp32", "int8"])
def llm(request, smollm2_path, model_store):
    return LLM(str(smollm2_path), model_store=str(model_store), max_num_seqs=8, num_kv_blocks=256,
               dtype=request.param)


def test_auto_picks_int8_for_the_q4_gguf(smollm2_path, model_store):
    from llmserve.models import kernels

    auto = LLM(str(smollm2_path), model_store=str(model_store), max_num_seqs=2, num_kv_blocks=16)
    assert auto.engine.config.dtype == ("int8" if kernels.cpu_supported() else "fp32")


def test_logits_match_transformers(llm, hf_model):
    tok = llm.get_tokenizer()
    ids = tok.encode_chat([{"role": "user", "content": "Name three colours of the rainbow."}])
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0, -1]
    eng = llm.engine
    eng.add_request("x", ids, SamplingParams(max_tokens=1, temperature=0, logprobs=5))
    out = None
    while eng.has_unfinished():
        for o in eng.step():
            out = o
    top = out.outputs[0].logprobs[0].top
    ref_lp = torch.log_softmax(ref, -1)
    assert [t for t, _ in top] == torch.topk(ref_lp, 5).indices.tolist()
    # int8 rounds the decode rows' activations per 32 values (llama.cpp's Q8 scheme): the
    # top 5 stay the same, their logprobs move by a few thousandths
    tol = 2e-3 if eng.config.dtype == "fp32" else 1.5e-2
    for t, lp in top:
        assert lp == pytest.approx(float(ref_lp[t]), abs=tol)


def test_greedy_chat_equals_transformers(llm, hf_model):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = llm.get_tokenizer().encode_chat(msgs)
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    out = llm.chat(msgs, SamplingParams(max_tokens=24, temperature=0))[0]
    n = len(out.token_ids)
    # int8 holds this file's Q4_1 / Q8_0 weights exactly; only summation order differs.
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
