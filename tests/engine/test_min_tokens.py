"""vLLM's ``min_tokens``: until the output has that many tokens, EOS and ``stop_token_ids``
cannot be generated and stop strings are not applied. Hugging Face's ``min_new_tokens`` is
the oracle; speculation (whose drafts propose the banned EOS), preemption, ``n`` and resume
must give the same tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from tokenizers import Tokenizer as RustTokenizer

import llmserve.engine.draft_model as draft_model
from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.llm import LLM
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.tokenizer import Tokenizer
from tests.engine.conftest import TinyModel, make_tiny, run_to_completion
from tests.helpers import make_tiny_llama, tiny_tokenizer_json

PROMPTS = [[5, 9, 33, 7, 5, 9, 33, 7, 5, 9], [100, 2, 17, 250, 3, 41], [60, 61, 62, 63, 60, 61, 62]]
MAX = 16


def test_min_tokens_is_checked_as_vllm_checks_it():
    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4
    assert SamplingParams(max_tokens=None, min_tokens=100).min_tokens == 100
    for bad in ({"max_tokens": 4, "min_tokens": 5}, {"min_tokens": -1}):
        with pytest.raises(InvalidParameterError) as e:
            SamplingParams(**bad)
        assert e.value.param == "min_tokens"


def _hf(tiny: TinyModel, ids: list[int], eos: int | None, min_new: int, n: int = MAX) -> list[int]:
    with torch.no_grad():
        out = tiny.hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=min_new or None,
                               do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def case():
    """The tiny model, and per prompt the token its greedy path emits second: made EOS, it
    ends the output at 2 tokens unless min_tokens holds it off."""
    tiny = make_tiny()
    eos = []
    for p in PROMPTS:
        g = _hf(tiny, p, None, 0, 3)
        assert g[1] != g[0]
        eos.append(g[1])
    return tiny, eos


def _engine(tiny: TinyModel, eos: list[int], monkeypatch, spec: str | None, **opts) -> EngineCore:
    mc = copy.deepcopy(tiny.config)
    mc.eos_token_id = eos
    if spec == "draft":  # the target's own weights: the draft proposes exactly the EOS the target must refuse
        monkeypatch.setattr(draft_model, "_load_draft", lambda cfg, store: LlamaForCausalLM(tiny.config, tiny.weights))
    if spec is not None:
        opts["speculative_config"] = {"method": spec, "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                      "prompt_lookup_max": 3, "adaptive": False,
                                      "model": "draft" if spec == "draft" else None}
    return EngineCore(EngineConfig(**opts), mc, tiny.weights)


@pytest.mark.parametrize("spec", [None, "ngram", "draft"])
def test_greedy_equals_hf_min_new_tokens(case, monkeypatch, spec):
    """Each prompt's EOS on its own; the requests share batches (and, with a small pool,
    are preempted and resumed) with rows that mask nothing."""
    tiny, eos = case
    preemptions = 0
    for i, p in enumerate(PROMPTS):
        eng = _engine(tiny, [eos[i]], monkeypatch, spec, block_size=4, num_kv_blocks=12,
                      max_num_batched_tokens=12)
        arrivals = {0: [(f"{k}", p, SamplingParams(max_tokens=MAX, min_tokens=k, temperature=0)) for k in (0, 3, 7)]}
        arrivals[1] = [("other", PROMPTS[(i + 1) % 3], SamplingParams(max_tokens=MAX, temperature=0))]
        done = run_to_completion(eng, arrivals)
        for k in (0, 3, 7):
            want = _hf(tiny, p, eos[i], k)
            assert done[f"{k}"] == want, (i, k, spec)
            assert len(want) == 2 if k == 0 else len(want) > k  # min_tokens changed the output
        if spec is not None:
            assert eng.spec.num_draft_tokens > 0
        assert eng.kv.num_free_blocks == eng.kv.num_blocks
        preemptions += eng.scheduler.num_preemptions
    assert preemptions > 0  # the output count carried over a recompute


@pytest.mark.parametrize("spec", [None, "ngram", "draft"])
def test_stop_token_ids_are_held_off_too(case, monkeypatch, spec):
    tiny, eos = case
    eng = _engine(tiny, [], monkeypatch, spec)
    sp = SamplingParams(max_tokens=MAX, min_tokens=5, temperature=0, stop_token_ids=[eos[0]])
    out = run_to_completion(eng, {0: [("a", PROMPTS[0], sp)]})["a"]
    assert out == _hf(tiny, PROMPTS[0], eos[0], 5)


@pytest.mark.parametrize("spec", [None, "ngram", "draft"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_forced_eos_comes_right_after_min_tokens(case, monkeypatch, spec, temperature):
    """logit_bias makes EOS all but certain: the output is min_tokens tokens, then EOS, sampled
    or greedy; drafts that guess EOS early are rejected, those after are taken."""
    tiny, eos = case
    eng = _engine(tiny, [eos[0]], monkeypatch, spec)
    arrivals = {0: [(f"{k}-{s}", PROMPTS[s % 3], SamplingParams(
        max_tokens=MAX, min_tokens=k, temperature=temperature, seed=s, logit_bias={eos[0]: 100.0}))
        for k in (0, 1, 6, MAX - 1) for s in range(3)]}
    done = run_to_completion(eng, arrivals)
    for k in (0, 1, 6, MAX - 1):
        for s in range(3):
            out = done[f"{k}-{s}"]
            assert len(out) == k + 1 and out[-1] == eos[0] and eos[0] not in out[:-1], (k, s, out)


def test_resumed_tokens_count_towards_min_tokens(case, monkeypatch):
    tiny, eos = case
    eng = _engine(tiny, [eos[0]], monkeypatch, None)
    sp = SamplingParams(max_tokens=MAX, min_tokens=6, temperature=0, logit_bias={eos[0]: 100.0})
    eng.add_request("r", PROMPTS[0], sp, resume_token_ids=[7, 8, 9, 10])
    out = run_to_completion(eng)["r"]
    assert out[:4] == [7, 8, 9, 10] and len(out) == 7 and out[-1] == eos[0]


# ---- stop strings ------------------------------------------------------------------------

def _text_engine(tiny: TinyModel, monkeypatch, spec: str | None) -> EngineCore:
    tok = Tokenizer(RustTokenizer.from_str(tiny_tokenizer_json(tiny.config.vocab_size)))
    eng = _engine(tiny, [], monkeypatch, spec)
    eng.tokenizer = tok
    eng.output.tokenizer = tok
    return eng


def _finish(eng: EngineCore, rid: str, prompt: list[int], sp: SamplingParams):
    eng.add_request(rid, prompt, sp)
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                return out.outputs[0]
    raise AssertionError("no output")


@pytest.mark.parametrize("spec", [None, "draft"])
def test_stop_strings_apply_only_to_text_after_min_tokens(case, monkeypatch, spec):
    """vLLM's rule: a stop string must end in the text of a token past the first min_tokens;
    one inside that text is passed over, a later one still stops. (The draft is the target:
    its drafts are all taken, so the min_tokens boundary falls inside a step's tokens.)"""
    tiny, _ = case
    eng = _text_engine(tiny, monkeypatch, spec)
    free = _finish(eng, "free", PROMPTS[1], SamplingParams(max_tokens=MAX, temperature=0, ignore_eos=True))
    tok = eng.tokenizer
    text = free.text
    stop = text[0]
    assert _finish(eng, "zero", PROMPTS[1], SamplingParams(max_tokens=MAX, temperature=0, ignore_eos=True,
                                                          stop=[stop])).text == ""
    checked = 0
    for k in range(1, MAX):
        head = tok.decode(free.token_ids[:k])
        if not text.startswith(head):
            continue  # (a character split across tokens: the boundary is not a clean cut)
        held = len(head)
        i = text.find(stop, held - len(stop) + 1)
        want = text if i < 0 else text[:i]
        out = _finish(eng, f"k{k}", PROMPTS[1], SamplingParams(max_tokens=MAX, temperature=0, ignore_eos=True,
                                                              min_tokens=k, stop=[stop]))
        assert out.text == want, (k, stop, text)
        assert (out.finish_reason, out.stop_reason) == (("length", None) if i < 0 else ("stop", stop))
        checked += 1
    assert checked > 5


def test_llm_generate_and_chat_take_min_tokens_with_n(tmp_path):
    llm = LLM(str(make_tiny_llama(tmp_path)), dtype="fp32", num_kv_blocks=64, max_num_seqs=4)
    eos = llm.get_tokenizer().eos_token_ids[0]
    sp = SamplingParams(n=3, max_tokens=12, min_tokens=5, temperature=1.0, seed=1, logit_bias={eos: 100.0})
    for out in (llm.generate("hello there", sp)[0], llm.chat([{"role": "user", "content": "hi"}], sp)[0]):
        assert len(out.outputs) == 3
        for c in out.outputs:
            assert len(c.token_ids) == 6 and c.token_ids[-1] == eos and c.finish_reason == "stop"
