"""``LLM.generate`` takes the prompt forms vLLM's does: text, token ids, and the dicts
``{"prompt": text}`` / ``{"prompt_token_ids": ids}``, one or a list."""

from __future__ import annotations

import pytest

from llmserve.engine.llm import LLM
from llmserve.engine.sampling_params import SamplingParams
from tests.helpers import make_tiny_llama

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(str(make_tiny_llama(tmp_path_factory.mktemp("m"))), dtype="fp32", num_kv_blocks=64, max_num_seqs=4)


def test_every_prompt_form_gives_the_same_tokens(llm):
    text = "hello there"
    ids = llm.get_tokenizer().encode(text)
    want = llm.generate(text, GREEDY)[0].outputs[0].token_ids
    assert llm.generate(ids, GREEDY)[0].outputs[0].token_ids == want
    assert llm.generate({"prompt": text}, GREEDY)[0].outputs[0].token_ids == want
    both = llm.generate([{"prompt_token_ids": ids}, {"prompt": text}], GREEDY)
    assert [o.outputs[0].token_ids for o in both] == [want, want]


def test_a_prompt_dict_with_other_keys_is_refused(llm):
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate({"prompt": "hi", "multi_modal_data": {}}, GREEDY)


def test_one_bad_prompt_in_a_list_leaves_none_of_the_others_running(llm):
    """All or nothing, as vLLM validates before adding: the prompts added before the bad one
    are aborted, so the next generate runs no orphan beside its own."""
    too_long = list(range(5)) * 400
    with pytest.raises(ValueError):
        llm.generate(["fine", "also fine", {"prompt_token_ids": too_long}], GREEDY)
    assert not llm.engine.has_unfinished()
    assert len(llm.generate("fine", GREEDY)) == 1


def test_chat_passes_tools_and_template_variables_to_the_template(tmp_path):
    """A template that writes them: dropped on the way, the prompt would not change."""
    template = ("{% if tools %}tools {{ tools | length }} {% endif %}{% if lang %}in {{ lang }} {% endif %}"
                "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    llm = LLM(str(make_tiny_llama(tmp_path, chat_template=template)), dtype="fp32", num_kv_blocks=32)
    chat = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    text = {kw: llm.get_tokenizer().decode(llm.chat(chat, GREEDY, **args)[0].prompt_token_ids)
            for kw, args in (("plain", {}), ("tools", {"tools": tools}),
                             ("lang", {"chat_template_kwargs": {"lang": "fr"}}))}
    assert "tools 1" in text["tools"] and "in fr" in text["lang"] and "tools" not in text["plain"]


def test_chat_takes_vllms_template_options_and_generate_a_priority_per_prompt(llm):
    tok = llm.get_tokenizer()
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello, I"}]
    out = llm.chat(chat, GREEDY, add_generation_prompt=False, continue_final_message=True)[0]
    assert out.prompt_token_ids == tok.encode_chat(chat, False, True)
    with pytest.raises(ValueError, match="add_generation_prompt=False"):
        llm.chat(chat, GREEDY, continue_final_message=True)
    with pytest.raises(ValueError, match="per call"):
        llm.chat(chat[:1], GREEDY, chat_template="{{ messages }}")
    both = llm.generate(["a b", "c d"], GREEDY, priority=[1, 0])
    assert [o.outputs[0].token_ids for o in both] == [llm.generate(p, GREEDY)[0].outputs[0].token_ids
                                                      for p in ("a b", "c d")]
    with pytest.raises(ValueError, match="one priority or one per prompt"):
        llm.generate(["a", "b"], GREEDY, priority=[0])
