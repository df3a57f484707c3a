"""``LLM.generate`` / ``LLM.chat`` take vLLM's ``lora_request``: greedy tokens equal
transformers + peft's merged model on the same adapter, a batch mixes adapters and the base,
and a bad adapter path or an LLM without LoRA is refused with nothing left running."""

from __future__ import annotations

import pytest

from llmserve import LoRARequest as TopLevel
from llmserve.engine.llm import LLM
from llmserve.engine.lora import LoRARequest
from llmserve.engine.sampling_params import SamplingParams
from tests.family_models import hf_greedy
from tests.helpers import make_tiny_llama
from tests.lora_adapters import make_adapter

N = 8
GREEDY = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True)
PROMPTS = [[5, 17, 40, 9, 33, 102], [70, 71, 72], [200, 3, 150, 151, 152, 9, 9, 12]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("lora-llm")
    folder = make_tiny_llama(root)
    hf = LlamaForCausalLM.from_pretrained(folder).eval()
    merged = {None: hf,
              "a": make_adapter(hf, root / "a", 4, ["q_proj", "v_proj"], seed=1),
              "b": make_adapter(hf, root / "b", 8, ["o_proj", "gate_proj", "down_proj"], seed=2)}
    ref = {(i, a): hf_greedy(m, p, N)[0] for a, m in merged.items() for i, p in enumerate(PROMPTS)}
    for i in range(len(PROMPTS)):  # the adapters matter: each changes some prompt's tokens
        assert ref[(i, "a")] != ref[(i, None)] or ref[(i, "b")] != ref[(i, None)]
    assert any(ref[(i, "a")] != ref[(i, None)] for i in range(len(PROMPTS)))
    assert any(ref[(i, "b")] != ref[(i, None)] for i in range(len(PROMPTS)))
    llm = LLM(str(folder), dtype="fp32", num_kv_blocks=64, max_num_seqs=4, enable_lora=True,
              max_lora_rank=8, max_loras=2)
    reqs = {"a": LoRARequest("a", 1, str(root / "a")), "b": LoRARequest("b", 2, str(root / "b"))}
    return llm, reqs, ref, root


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_one_lora_request_for_all_prompts_gives_peft_merged_tokens(setup, monkeypatch):
    llm, reqs, ref, _ = setup
    assert TopLevel is LoRARequest
    got = _tokens(llm.generate(PROMPTS, GREEDY, lora_request=reqs["a"]))
    assert got == [ref[(i, "a")] for i in range(len(PROMPTS))]
    # again: the adapter is registered once, by name and path, and reused (its files not read again)
    monkeypatch.setattr(llm.engine.lora, "read", lambda *a: pytest.fail("read again"))
    assert _tokens(llm.generate(PROMPTS[:1], GREEDY, lora_request=reqs["a"])) == [ref[(0, "a")]]
    assert llm.engine.lora.paths()["a"] == reqs["a"].lora_path


def test_a_mixed_batch_gives_each_prompt_its_own_adapter_or_the_base(setup):
    llm, reqs, ref, _ = setup
    jobs = [(p, a) for i, p in enumerate(PROMPTS) for a in (None, "a", "b")]
    idx = [(i, a) for i in range(len(PROMPTS)) for a in (None, "a", "b")]
    outs = llm.generate([p for p, _ in jobs], GREEDY, lora_request=[reqs[a] if a else None for _, a in jobs])
    assert _tokens(outs) == [ref[k] for k in idx]
    assert not llm.engine.has_unfinished()


def test_chat_takes_a_lora_request(setup):
    llm, reqs, _, _ = setup
    chat = [{"role": "user", "content": "hi there"}]
    ids = llm.get_tokenizer().encode_chat(chat, True, False)
    want = llm.generate({"prompt_token_ids": ids}, GREEDY, lora_request=reqs["b"])[0].outputs[0].token_ids
    assert llm.chat(chat, GREEDY, lora_request=reqs["b"])[0].outputs[0].token_ids == want


def test_a_bad_adapter_path_raises_naming_it_and_leaves_nothing_running(setup):
    llm, reqs, ref, root = setup
    bad = str(root / "missing")
    with pytest.raises(ValueError, match="missing"):
        llm.generate(PROMPTS, GREEDY, lora_request=[None, reqs["a"], LoRARequest("c", 3, bad)])
    assert not llm.engine.has_unfinished()
    assert "c" not in llm.engine.lora.paths()
    # a bad prompt after a new adapter: the adapter is not left registered either
    fresh = LoRARequest("d", 4, str(root / "b"))
    with pytest.raises(ValueError):
        llm.generate([PROMPTS[0], list(range(5)) * 400], GREEDY, lora_request=fresh)
    assert not llm.engine.has_unfinished() and "d" not in llm.engine.lora.paths()
    assert _tokens(llm.generate(PROMPTS[1], GREEDY, lora_request=reqs["a"])) == [ref[(1, "a")]]


def test_one_name_or_id_is_one_adapter(setup):
    llm, reqs, _, root = setup
    llm.generate(PROMPTS[0], GREEDY, lora_request=reqs["a"])
    with pytest.raises(ValueError, match="is loaded from"):
        llm.generate(PROMPTS[0], GREEDY, lora_request=LoRARequest("a", 1, str(root / "b")))
    with pytest.raises(ValueError, match="lora_int_id 1"):
        llm.generate(PROMPTS[0], GREEDY, lora_request=LoRARequest("other", 1, str(root / "b")))
    with pytest.raises(ValueError, match="one lora_request or one per prompt"):
        llm.generate(PROMPTS, GREEDY, lora_request=[reqs["a"]])
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("z", 0, str(root / "a"))
    assert not llm.engine.has_unfinished()


def test_an_llm_without_enable_lora_refuses_a_lora_request(tmp_path):
    llm = LLM(str(make_tiny_llama(tmp_path)), dtype="fp32", num_kv_blocks=32)
    with pytest.raises(ValueError, match="enable_lora=True"):
        llm.generate("hello", GREEDY, lora_request=LoRARequest("a", 1, str(tmp_path)))
    assert not llm.engine.has_unfinished()
    assert len(llm.generate("hello", GREEDY, lora_request=None)) == 1
