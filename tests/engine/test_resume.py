"""A resumed request (prompt + k output tokens given as already generated) continues
exactly as the unbroken one: the same tokens k+1.., greedy and seeded, the same
text from where the first stream's text stopped, stop strings across the boundary,
and the whole answer in its token count."""

from __future__ import annotations

import pytest

from llmserve.engine.config import EngineConfig
from llmserve.engine.llm import build_engine
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams
from tests.helpers import make_tiny_llama

PROMPT = "Once upon a time there was"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_llama(tmp_path_factory.mktemp("model"))
    return build_engine(EngineConfig(model=str(path), model_store=str(tmp_path_factory.mktemp("store")),
                                     max_num_seqs=4, enable_prefix_caching=True))


def run(engine, params: SamplingParams, resume: list[int] | None = None, rid: str = "r"):
    """(tokens, text) handed out after each output, and the final output."""
    engine.add_request(rid, PROMPT, params, resume_token_ids=resume)
    steps, ids, text = [], list(resume or []), ""
    while engine.has_unfinished():
        for o in engine.step():
            c = o.outputs[0]
            ids += c.delta_token_ids
            text += c.delta_text
            steps.append((list(ids), text))
            if o.finished:
                return steps, o


CASES = {
    "greedy": SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
    "greedy-penalised": SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, frequency_penalty=1.5,
                                       presence_penalty=0.5),
    "seeded": SamplingParams(max_tokens=40, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resumed_request_yields_the_unbroken_runs_tokens_and_text(engine, case):
    params = CASES[case]
    steps, final = run(engine, params)
    full = final.outputs[0].token_ids
    assert len(full) == 40
    resumed = 0
    for first in (1, 9, 23, 39):
        # the stream broken after its first output of at least ``first`` tokens (a step hands
        # out several when speculation, on by default, has drafts accepted)
        broken = [(i, t) for i, t in steps if first <= len(i) < len(full)]
        if not broken:
            continue
        ids_k, text_k = broken[0]
        k = len(ids_k)
        resumed += 1
        rsteps, rfinal = run(engine, params, resume=full[:k], rid=f"{case}-{k}")
        c = rfinal.outputs[0]
        assert c.token_ids == full, k  # the given tokens are its own output: 40 in all
        assert rsteps[-1][0] == full and c.finish_reason == "length"
        assert text_k + rsteps[-1][1] == final.outputs[0].text == c.text, k  # no gap, no repeat
    assert resumed >= 3


def test_seeded_draws_depend_on_the_position_not_on_earlier_draws(engine):
    """Otherwise a resumed stream would draw from a fresh generator's start."""
    a = run(engine, CASES["seeded"], rid="s1")[1].outputs[0].token_ids
    b = run(engine, SamplingParams(max_tokens=40, temperature=1.0, top_p=0.95, seed=1235, ignore_eos=True),
            rid="s2")[1].outputs[0].token_ids
    assert a != b  # the seed matters
    assert run(engine, CASES["seeded"], rid="s3")[1].outputs[0].token_ids == a


def test_a_stop_string_across_the_boundary_is_found(engine):
    plain = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    steps, final = run(engine, plain)
    text, full = final.outputs[0].text, final.outputs[0].token_ids
    found = 0
    handed_out = {len(i): t for i, t in steps}  # (speculation may hand out several tokens a step)
    for k in range(4, 36):
        if k not in handed_out:
            continue
        text_k = handed_out[k]
        a = len(text_k) - 2
        stop = text[a:a + 5]
        if len(stop) < 5 or text.find(stop) != a or len(text_k) < 3:
            continue
        params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop=[stop])
        ssteps, sfinal = run(engine, params, rid=f"stop-{k}")
        # what the unbroken stopped stream had handed out after k tokens (the stop's prefix held back)
        handed = next((t for i, t in ssteps if len(i) == k), None)
        if handed is None:
            continue
        rsteps, rfinal = run(engine, params, resume=full[:k], rid=f"stop-r{k}")
        assert rfinal.outputs[0].finish_reason == "stop" and rfinal.outputs[0].stop_reason == stop
        assert rfinal.outputs[0].text == sfinal.outputs[0].text == text[:a]
        assert handed + rsteps[-1][1] == text[:a]
        found += 1
    assert found >= 3


def test_resumed_tokens_count_against_max_tokens(engine):
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    full = run(engine, params)[1].outputs[0].token_ids
    with pytest.raises(InvalidParameterError, match="resume_token_ids"):
        engine.add_request("over", PROMPT, params, resume_token_ids=full)
    with pytest.raises(InvalidParameterError, match="vocabulary"):
        engine.add_request("bad", PROMPT, params, resume_token_ids=[10**6])
    assert not engine.has_unfinished()
