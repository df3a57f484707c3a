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
