"""What a vLLM user reads and sets on the offline ``LLM``: logprobs as vLLM's per-position
dicts of ``Logprob`` with ``cumulative_logprob``, vLLM's ``SamplingParams`` fields either
honoured (``truncate_prompt_tokens``, ``detokenize``, ``output_kind``, ``best_of`` equal to
``n``) or refused by name, and ``LLM.chat``'s ``prompt`` the rendered conversation."""

from __future__ import annotations

import math

import pytest

from llmserve.engine.llm import LLM
from llmserve.engine.outputs import Logprob
from llmserve.engine.sampling_params import InvalidParameterError, RequestOutputKind, SamplingParams
from tests.helpers import make_tiny_llama


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 4, "temperature": 0, "ignore_eos": True, **kw})


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(str(make_tiny_llama(tmp_path_factory.mktemp("m"))), dtype="fp32", num_kv_blocks=64, max_num_seqs=4)


def test_logprobs_are_vllms_dicts_with_a_cumulative_logprob(llm):
    out = llm.generate("hello there", greedy(logprobs=3))[0]
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 4 and out.prompt_logprobs is None
    for tid, step in zip(c.token_ids, c.logprobs):
        assert isinstance(step, dict) and tid in step and all(isinstance(v, Logprob) for v in step.values())
        assert sorted(v.rank for v in step.values()) == [1, 2, 3]  # greedy: the sampled one is among them
        assert step[tid].rank == 1 and isinstance(step[tid].decoded_token, str)
        assert step[tid].decoded_token == llm.get_tokenizer().decode([tid], False)
    assert math.isclose(c.cumulative_logprob, sum(step[t].logprob for t, step in zip(c.token_ids, c.logprobs)))
    plain = llm.generate("hello there", greedy())[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None and plain.token_ids == c.token_ids


@pytest.mark.parametrize("fields,param", [
    ({"best_of": 3}, "best_of"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ({"detokenize": False, "stop": ["x"]}, "stop"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
])
def test_what_is_not_implemented_is_refused_by_name(fields, param):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**fields)
    assert e.value.param == param


def test_truncate_prompt_tokens_keeps_the_last_ones(llm):
    ids = llm.get_tokenizer().encode("one two three four five six")
    out = llm.generate("one two three four five six", greedy(truncate_prompt_tokens=3))[0]
    assert out.prompt_token_ids == ids[-3:]
    assert out.outputs[0].token_ids == llm.generate({"prompt_token_ids": ids[-3:]}, greedy())[0].outputs[0].token_ids
    assert llm.generate(ids, greedy(truncate_prompt_tokens=-1))[0].prompt_token_ids == ids
    most = llm.engine.max_model_len  # -1 cuts a longer prompt to the context (which then leaves no room)
    with pytest.raises(ValueError, match=f"the prompt has {most} tokens"):
        llm.generate(ids * (most // len(ids) + 2), greedy(truncate_prompt_tokens=-1))


def test_detokenize_false_gives_token_ids_only(llm):
    want = llm.generate("hello there", greedy())[0].outputs[0].token_ids
    c = llm.generate("hello there", greedy(detokenize=False, logprobs=1))[0].outputs[0]
    assert (c.text, c.token_ids) == ("", want)
    assert all(v.decoded_token is None for step in c.logprobs for v in step.values())


def test_output_kind_and_best_of_equal_to_n_are_taken(llm):
    want = llm.generate("hello there", greedy())[0].outputs[0].token_ids
    for kind in RequestOutputKind:
        assert llm.generate("hello there", greedy(output_kind=kind))[0].outputs[0].token_ids == want
    out = llm.generate("hello there", greedy(n=2, best_of=2))[0]
    assert [c.token_ids for c in out.outputs] == [want, want]
    assert llm.get_default_sampling_params() == SamplingParams()


def test_chat_prompt_is_the_rendered_conversation_one_output_per_conversation(llm):
    convs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hello there"}]]
    outs = llm.chat(convs, greedy())
    tok = llm.get_tokenizer()
    assert [o.prompt_token_ids for o in outs] == [tok.encode_chat(c) for c in convs]
    assert [o.prompt for o in outs] == [tok.apply_chat_template(c) for c in convs]


def test_a_stop_token_is_text_only_with_include_stop_str_in_output(llm):
    """vLLM v1's detokenizer leaves the stop token out of the text unless asked to keep it."""
    ids = llm.generate("hello there", greedy(max_tokens=6))[0].outputs[0].token_ids
    stop = ids[2]
    tok = llm.get_tokenizer()
    c = llm.generate("hello there", greedy(max_tokens=6, stop_token_ids=[stop]))[0].outputs[0]
    assert (c.token_ids, c.finish_reason, c.stop_reason) == (ids[:3], "stop", stop)
    kept = llm.generate("hello there", greedy(max_tokens=6, stop_token_ids=[stop],
                                              include_stop_str_in_output=True))[0].outputs[0]
    assert kept.token_ids == ids[:3] and kept.text == tok.decode(ids[:3]) != c.text == tok.decode(ids[:2])


def test_chat_joins_text_parts_as_vllm_and_refuses_other_parts(llm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]}]
    joined = [{"role": "user", "content": "hello\nthere"}]
    assert llm.chat(parts, greedy())[0].prompt_token_ids == llm.chat(joined, greedy())[0].prompt_token_ids
    with pytest.raises(ValueError, match="image_url"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], greedy())
