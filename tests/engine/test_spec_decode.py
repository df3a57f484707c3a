"""Speculative decoding: lossless greedy, exact sampling distribution, exact KV accounting."""

from __future__ import annotations

import random

import pytest
import torch

import llmserve.engine.draft_model as draft_model
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.config import SpeculativeConfig
from llmserve.engine.proposer import NgramProposer, Proposal, _NgramIndex, find_ngram_continuation
from llmserve.engine.request import Request
from llmserve.engine.sampler import RowBuilder
from llmserve.engine.spec_decode import SpeculativeDecoder, rejection_sample
from llmserve.engine.spec_policy import MARGIN, Acceptance, draft_lengths
from llmserve.engine.step_cost import StepCosts
from llmserve.models.llama import LlamaForCausalLM
from tests.engine.conftest import make_tiny, run_to_completion
from tests.engine.test_sampler import _chi2_ok


def test_ngram_lookup_prefers_longest_latest_match():
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert find_ngram_continuation(toks, 1, 3, 2) == [7, 8]  # "2 3" last seen before 7 8
    assert find_ngram_continuation([1, 2, 3, 4], 1, 3, 2) == []
    assert find_ngram_continuation([5, 6, 5], 1, 2, 3) == [6, 5]


def test_ngram_index_gives_what_the_scan_gives():
    rng = random.Random(0)
    for _ in range(300):
        vocab = rng.choice([2, 3, 5, 50])
        toks = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        lo = rng.randint(1, 3)
        hi, k = rng.randint(lo, 5), rng.randint(1, 6)
        index, seq = _NgramIndex(lo, hi), []
        for t in toks:  # asked at some lengths only: it catches up on the tokens in between
            seq.append(t)
            if rng.random() < 0.5:
                assert index.continuation(seq, k) == find_ngram_continuation(seq, lo, hi, k)
        assert index.continuation(seq, k) == find_ngram_continuation(seq, lo, hi, k)


@pytest.fixture(scope="module")
def setup():
    tiny = make_tiny()
    v = tiny.config.vocab_size
    rng = random.Random(3)
    rep = [rng.randrange(v) for _ in range(12)]
    prompts = [rep * 3, [rng.randrange(v) for _ in range(20)], rep + rep[:5], rep[:2]]
    ref = [tiny.hf_greedy(p, 30) for p in prompts]
    return tiny, prompts, ref


def _use_draft(monkeypatch, model):
    monkeypatch.setattr(draft_model, "_load_draft", lambda cfg, store: LlamaForCausalLM(model.config, model.weights))


@pytest.mark.parametrize("method,k", [("ngram", 1), ("ngram", 4), ("draft", 2), ("draft", 4)])
def test_greedy_equals_hf_with_everything_on(setup, monkeypatch, method, k):
    tiny, prompts, ref = setup
    _use_draft(monkeypatch, make_tiny(seed=5, layers=1))
    cfg = {"method": method, "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4,
           "adaptive": False, "model": "draft" if method == "draft" else None}
    sp = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    # a small pool forces preemption; a small budget forces chunked prefill; caching on
    eng = tiny.engine(block_size=4, max_num_batched_tokens=10, num_kv_blocks=24, speculative_config=cfg,
                      enable_prefix_caching=True)
    arrivals = {0: [("0", prompts[0], sp), ("1", prompts[1], sp)], 4: [("2", prompts[2], sp), ("3", prompts[3], sp)]}
    done = run_to_completion(eng, arrivals)
    assert [done[str(i)] for i in range(4)] == ref
    assert eng.spec.num_draft_tokens > 0
    assert eng.scheduler.num_preemptions > 0
    assert eng.kv.num_free_blocks == eng.kv.num_blocks
    if method == "ngram":
        assert eng.spec.num_accepted_tokens > 0  # the repeated prompts make lookup pay


def test_draft_identical_to_target_is_accepted(setup, monkeypatch):
    tiny, prompts, ref = setup
    _use_draft(monkeypatch, tiny)
    eng = tiny.engine(num_kv_blocks=128, speculative_config={"method": "draft", "model": "self",
                                                              "num_speculative_tokens": 3, "adaptive": False})
    eng.add_request("a", prompts[1], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    assert run_to_completion(eng)["a"] == ref[1]
    spec = eng.spec
    assert spec.num_accepted_tokens >= 0.9 * spec.num_draft_tokens
    assert spec.accepted_per_pos[0] >= spec.accepted_per_pos[2] > 0


class _Oracle(NgramProposer):
    """Proposes the reference continuation (``right``) or a token the model never picks."""

    def __init__(self, ref: dict[int, list[int]], right: bool, vocab: int) -> None:
        super().__init__(1, 3)
        self.ref, self.right, self.vocab = ref, right, vocab
        self.asked: list[int] = []

    def propose(self, requests, k, rows):
        out = {}
        for r in requests:
            prompt, done = len(r.prompt_token_ids), r.num_output_tokens
            ref = self.ref[prompt]
            self.asked.append(done)
            toks = ref[done:done + k] if self.right else [(ref[done] + 1) % self.vocab] * k
            if toks:
                out[r.request_id] = Proposal(toks)
        return out


def _with_proposer(eng, proposer) -> None:
    eng.spec.proposer = proposer


def test_draft_length_grows_to_the_cap_while_drafts_are_accepted(setup):
    tiny, prompts, ref = setup
    eng = tiny.engine(num_kv_blocks=128, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                              "max_speculative_tokens": 6})
    _with_proposer(eng, _Oracle({len(prompts[1]): ref[1]}, True, tiny.config.vocab_size))
    eng.add_request("a", prompts[1], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    assert run_to_completion(eng)["a"] == ref[1]
    spec = eng.spec
    assert len(spec.accepted_per_pos) == 6 and spec.accepted_per_pos[5] > 0
    assert spec.num_accepted_tokens == spec.num_draft_tokens > 3 * spec.num_drafts  # longer than k on average


def test_rejected_drafts_stop_speculation_and_it_is_tried_again_later(setup):
    tiny, prompts, ref = setup
    long_ref = tiny.hf_greedy(prompts[1], 120)
    eng = tiny.engine(num_kv_blocks=128, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    wrong = _Oracle({len(prompts[1]): long_ref}, False, tiny.config.vocab_size)
    _with_proposer(eng, wrong)
    eng.add_request("b", prompts[1], SamplingParams(max_tokens=120, temperature=0, ignore_eos=True))
    assert run_to_completion(eng)["b"] == long_ref
    spec = eng.spec
    assert spec.num_accepted_tokens == 0
    assert 2 <= spec.num_drafts < 30  # 120 decode steps, most without a draft
    assert max(wrong.asked) > 40  # probed again after the evidence faded


def test_acceptance_estimate_follows_the_evidence():
    acc = Acceptance()
    prior = acc.rate
    for _ in range(6):
        acc.observe(proposed=4, accepted=4)
    assert acc.rate > 0.9
    for _ in range(30):  # the evidence of about the last ten drafts counts
        acc.observe(proposed=4, accepted=0)
    assert acc.rate < 0.25
    low = acc.rate
    for _ in range(300):  # no drafts for a while: the evidence fades, the prior returns
        acc.idle()
    assert low < acc.rate < prior + 1e-9 and abs(acc.rate - prior) < 0.1


def test_draft_lengths_pay_for_themselves_and_shrink_with_the_batch():
    c = StepCosts()  # base 8 ms, a decoding row 3 ms, a draft row 1.7 ms
    assert draft_lengths([0.95], [8], c, decoding=1) == [8]
    assert draft_lengths([0.05], [8], c, decoding=1) == [0]
    # a draft token pays while its value beats the step's tokens per second (by MARGIN)
    k = draft_lengths([0.8], [16], c, decoding=1)[0]
    assert 1 <= k < 16
    seconds, tokens = c.base_s + c.decode_seq_s, 1.0
    for j in range(1, k + 1):
        assert 0.8 ** j * seconds > MARGIN * tokens * c.draft_row_s
        tokens, seconds = tokens + 0.8 ** j, seconds + c.draft_row_s
    assert 0.8 ** (k + 1) * seconds <= MARGIN * tokens * c.draft_row_s
    # the same request in a compute-bound batch of 64 gets fewer
    assert draft_lengths([0.8] + [0.0] * 63, [8] * 64, c, decoding=64)[0] < k
    # the likelier request gets the drafts first; caps hold; a costly proposer gets none
    few = draft_lengths([0.9, 0.5], [3, 8], c, decoding=2)
    assert few[0] == 3 and few[1] < 3
    assert draft_lengths([0.9], [8], c, decoding=1, token_cost_s=0.02) == [0]


P = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
Q = torch.tensor([0.1, 0.1, 0.5, 0.2, 0.1])


def _first_tokens(q_given: bool, broken: bool = False, n: int = 6000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(P))
    for _ in range(n):
        x = int(torch.multinomial(Q, 1, generator=gen)) if q_given else 2
        q_rows = Q.unsqueeze(0) if q_given else None
        if broken:  # accept every draft: the draft's distribution leaks through
            counts[x] += 1
            continue
        toks, _ = rejection_sample([P, P], [x], q_rows, False, gen)
        counts[toks[0]] += 1
    return counts


def test_rejection_sampling_keeps_target_distribution():
    assert _chi2_ok(_first_tokens(q_given=True), P)
    assert _chi2_ok(_first_tokens(q_given=False), P)  # n-gram: one-hot draft


def test_broken_rejection_sampler_is_caught():
    assert not _chi2_ok(_first_tokens(q_given=True, broken=True), P)


def test_seeded_sampling_is_the_same_with_speculation_on_and_off(setup):
    """Seeded sampled requests get no drafts, so their draws depend on (seed, position) only:
    the same tokens as without speculation, which is what lets a resumed stream go on exactly."""
    tiny, prompts, _ = setup
    sp = SamplingParams(max_tokens=20, temperature=0.8, top_k=50, seed=11, ignore_eos=True)
    outs = []
    for cfg in ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}, None):
        eng = tiny.engine(num_kv_blocks=128, speculative_config=cfg)
        eng.add_request("a", prompts[0], sp)
        eng.add_request("g", prompts[0], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
        done = run_to_completion(eng)
        outs.append(done["a"])
        if cfg is not None:
            assert eng.spec.num_drafts > 0  # the greedy one beside it speculates
    assert outs[0] == outs[1]


class _Recording(NgramProposer):
    def __init__(self) -> None:
        super().__init__(1, 3)
        self.released: list[str] = []

    def release(self, request_id: str) -> None:
        self.released.append(request_id)


def _decoding(rid: str, tokens: list[int], max_tokens: int) -> Request:
    req = Request(rid, tokens, SamplingParams(max_tokens=max_tokens, temperature=0), max_tokens)
    req.num_computed_tokens = req.num_tokens - 1
    return req


def test_the_decoder_needs_no_engine_and_respects_its_inputs():
    proposer = _Recording()
    live = {"a", "b"}
    spec = SpeculativeDecoder(SpeculativeConfig(method="ngram", num_speculative_tokens=4, adaptive=False), proposer,
                              max_model_len=12, rows=RowBuilder().row, live_ids=lambda: live,
                              guided=lambda: None, generator=torch.Generator())
    a = _decoding("a", [1, 2, 3, 4, 5, 6, 1, 2], 6)  # the lookup would give 3 4 5 6
    b = _decoding("b", [7, 8, 9, 7, 8], 3)
    spec.propose([a, b])
    assert a.spec_token_ids == [3, 4, 5]  # 12 - 8 - 1 positions left in the context
    assert b.spec_token_ids == [9, 7]  # max_tokens 3: two drafts and the bonus token
    live.discard("b")
    spec.propose([a])
    assert proposer.released == ["b"]
