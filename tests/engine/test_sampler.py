"""Sampling statistics on a small vocabulary, seeds, penalties and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from llmserve.engine.llm import fan_out
from llmserve.engine.sampler import DEAD_END, NonFiniteError, SampleRow, Sampler, non_finite_rows, process
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from llmserve.models.ops import TorchOps, layer_ops
from tests.engine.conftest import run_to_completion

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def _row(**kw) -> SampleRow:
    return SampleRow(SamplingParams(**kw), [0], [], None)


def _counts(params: dict, n: int = 6000, seed: int = 0) -> torch.Tensor:
    s = Sampler(seed)
    rows = [_row(**params)] * n
    toks = [t.token_id for t in s.sample(LOGITS.repeat(n, 1), rows)]
    return torch.bincount(torch.tensor(toks), minlength=len(LOGITS)).float()


def _chi2_ok(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    n = counts.sum()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "sampled a token with zero probability"
    exp = probs[keep] * n
    stat = float(((counts[keep] - exp) ** 2 / exp).sum())
    dof = int(keep.sum()) - 1
    return stat < dof + 4 * math.sqrt(2 * dof) + 10  # far in the tail of chi2(dof)


@pytest.mark.parametrize("params,expected", [
    ({"temperature": 1.0}, torch.softmax(LOGITS, -1)),
    ({"temperature": 0.5}, torch.softmax(LOGITS / 0.5, -1)),
    ({"temperature": 1.0, "top_k": 3}, torch.softmax(torch.tensor([2.0, 1.0, 0.5]), -1)),
    ({"temperature": 1.0, "top_p": 0.8}, None),
    ({"temperature": 1.0, "min_p": 0.2}, None),
])
def test_distribution_matches(params, expected):
    p = torch.softmax(LOGITS, -1)
    if expected is None and "top_p" in params:
        keep = torch.cumsum(p, 0) - p < params["top_p"]
        expected = torch.where(keep, p, 0.0)
    if expected is None and "min_p" in params:
        expected = torch.where(p >= params["min_p"] * p.max(), p, 0.0)
    expected = torch.nn.functional.pad(expected, (0, len(LOGITS) - len(expected)))
    expected = expected / expected.sum()
    assert torch.allclose(process(LOGITS, _row(**params)), expected, atol=1e-6)
    assert _chi2_ok(_counts(params), expected)


def test_broken_distribution_is_detected():
    wrong = torch.softmax(LOGITS / 0.8, -1)
    assert not _chi2_ok(_counts({"temperature": 1.0}), wrong)


def test_penalties():
    row = SampleRow(SamplingParams(temperature=0, repetition_penalty=2.0), [0], [1, 1], None)
    out = process(LOGITS, row)
    assert out[0] == 1.0 and out[1] == 0.5 and out[2] == 0.5
    row = SampleRow(SamplingParams(temperature=0, frequency_penalty=0.5, presence_penalty=1.0), [0], [1, 1], None)
    out = process(LOGITS, row)
    assert out[0] == 2.0 and out[1] == pytest.approx(1.0 - 1.0 - 1.0)


def test_logprobs_are_raw_model_logprobs():
    s = Sampler(0)
    tok = s.sample(LOGITS.unsqueeze(0), [_row(temperature=0, logprobs=2)])[0]
    lp = torch.log_softmax(LOGITS, -1)
    assert tok.token_id == 0 and tok.logprob == pytest.approx(float(lp[0]))
    assert [t for t, _ in tok.top_logprobs] == [0, 1]


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("bad", [
    dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2), dict(min_p=2),
    dict(logprobs=50), dict(n=0),
    # non-finite, or finite but 0 or inf once in fp32 (1e-300 made logits inf: issue 17)
    dict(repetition_penalty=1e-300), dict(repetition_penalty=INF), dict(repetition_penalty=NAN),
    dict(repetition_penalty=0.001), dict(repetition_penalty=1000.0), dict(temperature=INF),
    dict(temperature=NAN), dict(temperature=1e6), dict(top_p=NAN), dict(min_p=NAN),
    dict(presence_penalty=NAN), dict(frequency_penalty=-INF),
    dict(seed=2**64), dict(seed=-2**63 - 1), dict(seed=1.5)])
def test_bad_parameters_name_the_parameter(bad):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**bad)
    assert e.value.param == next(iter(bad))


def test_seeded_sampling_is_reproducible_across_batches(tiny):
    sp = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    other = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    eng = tiny.engine(num_kv_blocks=64)
    eng.add_request("alone", [1, 2, 3], sp)
    alone = run_to_completion(eng)["alone"]
    eng = tiny.engine(num_kv_blocks=64)
    eng.add_request("x", [5, 6, 7, 8, 9], other)
    eng.add_request("seeded", [1, 2, 3], sp)
    eng.add_request("y", [9, 9], other)
    assert run_to_completion(eng)["seeded"] == alone
    eng = tiny.engine(num_kv_blocks=64)
    eng.add_request("seeded", [1, 2, 3], SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=99,
                                                         ignore_eos=True))
    assert run_to_completion(eng)["seeded"] != alone


# ---- logit_bias and grammar masks (constrain), batched ---------------------------------------

def test_logit_bias_shifts_the_distribution_by_exactly_the_bias():
    bias = {5: 4.0, 0: -1.5}
    expected = torch.softmax(LOGITS + torch.tensor([-1.5, 0, 0, 0, 0, 4.0]), -1)
    assert _chi2_ok(_counts({"temperature": 1.0, "logit_bias": bias}), expected)
    assert not _chi2_ok(_counts({"temperature": 1.0, "logit_bias": bias}), torch.softmax(LOGITS, -1))


def test_logit_bias_is_per_row_in_one_batch_and_logprobs_stay_raw():
    rows = [_row(temperature=0, logit_bias={5: 100}), _row(temperature=0), _row(temperature=0, logit_bias={0: -100}),
            _row(temperature=0, logprobs=0, logit_bias={3: 100})]
    out = Sampler(0).sample(LOGITS.repeat(4, 1), rows)
    assert [t.token_id for t in out] == [5, 0, 1, 3]
    assert out[3].logprob == pytest.approx(float(torch.log_softmax(LOGITS, -1)[3]))


def test_bias_ids_outside_the_vocabulary_are_refused(tiny):
    eng = tiny.engine()
    with pytest.raises(InvalidParameterError) as e:
        eng.add_request("r", [1, 2], SamplingParams(logit_bias={tiny.config.vocab_size: 1.0}))
    assert e.value.param == "logit_bias"
    with pytest.raises(InvalidParameterError):
        SamplingParams(logit_bias={1: 101.0})


def test_a_mask_leaves_only_allowed_tokens_and_rows_without_one_alone():
    allowed = torch.tensor([[(1 << 2) | (1 << 4)]], dtype=torch.int32)  # tokens 2 and 4
    rows = [SampleRow(SamplingParams(temperature=1.0), [0], [], None, allowed[0])] * 3000 + [_row(temperature=1.0)] * 3000
    toks = [t.token_id for t in Sampler(1).sample(LOGITS.repeat(6000, 1), rows)]
    p = torch.softmax(LOGITS, -1)
    masked = torch.zeros(6)
    masked[[2, 4]] = p[[2, 4]] / p[[2, 4]].sum()
    assert _chi2_ok(torch.bincount(torch.tensor(toks[:3000]), minlength=6).float(), masked)
    assert _chi2_ok(torch.bincount(torch.tensor(toks[3000:]), minlength=6).float(), p)


@pytest.mark.parametrize("seed", [2**64 - 1, 2**63 - 1, -2**63, -1])
def test_seeds_at_the_ends_of_torchs_range_are_valid_for_every_child(seed):
    children = fan_out(SamplingParams(n=3, seed=seed, temperature=1.0))
    draws = []
    for child in children:
        g = torch.Generator()
        g.manual_seed(child.seed)  # raises for a seed torch cannot take
        draws.append(float(torch.rand(1, generator=g)))
    parent = torch.Generator()
    parent.manual_seed(seed)
    assert draws[0] == float(torch.rand(1, generator=parent))  # child 0 keeps the parent's stream
    assert len(set(draws)) == 3


def test_non_finite_rows():
    x = LOGITS.repeat(4, 1)
    assert non_finite_rows(x) == []
    x[1, 2], x[3, 0] = NAN, INF
    assert non_finite_rows(x) == [1, 3]
    assert non_finite_rows(torch.full((2, 6), 3e38)) == []  # the sum overflows, the rows are fine
    # read at the rows' argmax instead of a pass: the same rows, a row of -inf only too
    x[2] = -INF
    for ops in (TorchOps(), layer_ops()):  # torch.argmax and the kernels'
        assert non_finite_rows(x, ops.argmax(x)) == non_finite_rows(x) == [1, 2, 3]


def _seeded_rows(params: dict, n: int) -> list[SampleRow]:
    rows = []
    for i in range(n):
        g = torch.Generator()
        g.manual_seed(100 + i)
        rows.append(SampleRow(SamplingParams(**params), [0, 1], [2], g))
    return rows


@pytest.mark.parametrize("params", [dict(temperature=0), dict(temperature=0, repetition_penalty=1.5),
                                    dict(temperature=0.8, top_k=4, seed=1), dict(temperature=1.0, min_p=0.1)])
@pytest.mark.parametrize("poison", [NAN, INF])
def test_a_non_finite_row_is_failed_and_the_others_sample_as_without_it(params, poison):
    good = torch.stack([LOGITS, LOGITS.flip(0), LOGITS * 0.5])
    alone = Sampler(0).sample(good, _seeded_rows(params, 3))
    bad_row = LOGITS.clone()
    bad_row[3] = poison
    logits = torch.cat([good[:1], bad_row[None], good[1:]])
    rows = _seeded_rows(params, 3)
    rows.insert(1, _seeded_rows(params, 1)[0])
    out = Sampler(0).sample(logits, rows)
    assert out[1].error is not None and "not finite" in out[1].error
    assert [t.token_id for t in out[:1] + out[2:]] == [t.token_id for t in alone]
    assert all(t.error is None for t in alone)


def test_process_refuses_a_distribution_it_cannot_sample():
    row = SampleRow(SamplingParams(temperature=0, repetition_penalty=2.0), [0], [], None)
    with pytest.raises(NonFiniteError):
        process(torch.tensor([INF, 1.0, 0.0]), row)  # inf stays inf after the penalty
    row = SampleRow(SamplingParams(temperature=1.0), [0], [], None)
    with pytest.raises(NonFiniteError):
        process(torch.tensor([NAN, 1.0, 0.0]), row)
    assert process(torch.tensor([-INF, 1.0, 0.0]), row)[0] == 0.0  # a banned token is fine


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_a_masked_row_samples_and_a_mask_that_allows_nothing_fails_alone(temperature):
    """A grammar's -inf is a banned token, not a fault; a row with nothing left is one."""
    only_4, nothing = torch.tensor([1 << 4], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    rows = [SampleRow(SamplingParams(temperature=temperature), [0], [], None, only_4), _row(temperature=temperature),
            SampleRow(SamplingParams(temperature=temperature), [0], [], None, nothing)]
    out = Sampler(0).sample(LOGITS.repeat(3, 1), rows)
    assert out[0].token_id == 4 and out[0].error is None and out[1].error is None
    assert out[2].error == DEAD_END  # (the request's own constraint: the API's 400, not a 500)
