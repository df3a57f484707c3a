"""Structured outputs after ``</think>``: with a reasoning style set, the grammar leaves the
reasoning free and constrains the answer only, with speculation, chunked prefill, prefix
caching and preemption on; the prompt decides where the output starts (Qwen3's template
with ``enable_thinking`` false writes the empty pair into it)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.grammar import GrammarBackend
from llmserve.engine.reasoning_gate import ANSWER, OPENING, REASONING, AfterReasoning, first_phase
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams, StructuredOutputsParams
from llmserve.models.tokenizer import Tokenizer
from tests.engine.conftest import make_tiny
from tests.engine.test_guided import _run
from tests.helpers import tiny_tokenizer_json

SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["age", "ok"], "additionalProperties": False}
VOCAB = 384


@pytest.fixture(scope="module")
def tiny():
    return make_tiny()


@pytest.fixture(scope="module")
def tok():
    # Qwen3's tags: added tokens, not special (they stay in the decoded text)
    rust = RustTokenizer.from_str(tiny_tokenizer_json(VOCAB - 2))
    rust.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    return Tokenizer(rust, bos_token="<|im_start|>", eos_token="<|im_end|>")


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _engine(tiny, tok, **opts) -> EngineCore:
    base = dict(block_size=4, max_num_batched_tokens=12, num_kv_blocks=100, enable_prefix_caching=True,
                speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                    "prompt_lookup_max": 3, "adaptive": False})
    return EngineCore(EngineConfig(**{**base, **opts}), tiny.config, tiny.weights, tok)


def _answer(text: str) -> dict:
    obj = json.loads(text)
    jsonschema.validate(obj, SCHEMA)
    return obj


def _params(tok, style: str | None, seed: int, **bias_text: float) -> SamplingParams:
    # "Z" is refused where a JSON object starts: an output that opens with it was not masked
    bias = {_ids(tok, t)[0]: b for t, b in bias_text.items()}
    return SamplingParams(max_tokens=150, temperature=1.0, seed=seed, logit_bias=bias,
                          structured_outputs=StructuredOutputsParams(json=SCHEMA, after_reasoning=style))


def test_the_reasoning_is_free_and_the_answer_matches_the_schema(tiny, tok):
    eng = _engine(tiny, tok)
    bias = {"Z": 9.0, "</think>": 7.5}
    prompt = "Hello world! How are you today?"
    reqs = [(f"r{i}", prompt, _params(tok, "deepseek_r1", i, **bias)) for i in range(6)]
    free = 0
    for out in _run(eng, reqs).values():
        assert "</think>" in out.text, out.text
        reasoning, answer = out.text.split("</think>", 1)
        free += reasoning.startswith("Z")  # unconstrained: the grammar refuses "Z" there
        _answer(answer)
    assert free >= 3


def test_qwen3_style_reasons_only_after_an_opening_tag(tiny, tok):
    eng = _engine(tiny, tok)
    think = _ids(tok, "<think>")
    for i in range(3):  # <think> forced as the first output token (token-exact resume)
        eng.add_request(f"o{i}", "Hello world!", _params(tok, "qwen3", i, Z=9.0, **{"</think>": 7.5}),
                        resume_token_ids=think)
    plain = [(f"p{i}", "Hello world!", _params(tok, "qwen3", i, Z=9.0, **{"<think>": -100.0})) for i in range(3)]
    done = _run(eng, plain)
    for i in range(3):
        _answer(done[f"o{i}"].text.split("</think>", 1)[1])
        _answer(done[f"p{i}"].text)  # no <think> first: the grammar held from the first token


def test_a_prompt_that_closed_the_reasoning_starts_in_the_answer(tiny, tok):
    """Qwen3 with enable_thinking false: the empty pair ends the prompt, so the answer is all."""
    eng = _engine(tiny, tok)
    closed = _ids(tok, "Hello<think>") + _ids(tok, "\n\n</think>") + _ids(tok, "\n\n")
    opened = _ids(tok, "Hello</think> world<think>")
    done = _run(eng, [("closed", closed, _params(tok, "deepseek_r1", 0, Z=9.0)),
                      ("open", opened, _params(tok, "qwen3", 1, Z=9.0, **{"</think>": 7.5}))])
    _answer(done["closed"].text)
    assert done["open"].text.startswith("Z") and "</think>" in done["open"].text
    _answer(done["open"].text.split("</think>", 1)[1])


def test_without_a_style_the_grammar_holds_from_the_first_token(tiny, tok):
    eng = _engine(tiny, tok)
    done = _run(eng, [("a", "Hello", _params(tok, None, 0, Z=9.0, **{"</think>": 7.5}))])
    _answer(done["a"].text)


def test_resumed_output_replays_through_the_reasoning(tiny, tok):
    """Token-exact resume: forced output tokens (reasoning the grammar would refuse, then the
    closing tag) put the matcher in the answer; what follows matches the schema."""
    eng = _engine(tiny, tok)
    forced = _ids(tok, "Z{{") + _ids(tok, "</think>")
    eng.add_request("r", "Hello", _params(tok, "deepseek_r1", 0, Z=9.0), resume_token_ids=forced)
    out = _run(eng, [])["r"]
    assert out.outputs[0].token_ids[:len(forced)] == forced
    _answer(out.text.split("</think>", 1)[1])


def test_matcher_phases_masks_and_rollback(tok):
    backend = GrammarBackend(tok, VOCAB, [2])
    compiled = backend.compile(StructuredOutputsParams(json=SCHEMA))
    start, end = _ids(tok, "<think>")[0], _ids(tok, "</think>")[0]
    z = _ids(tok, "Z")[0]
    assert first_phase("qwen3", start, end, []) == OPENING
    assert first_phase("deepseek_r1", start, end, []) == REASONING
    assert first_phase("qwen3", start, end, [start, 5, end, 7]) == ANSWER
    assert first_phase("qwen3", start, end, [end, start, 5]) == REASONING

    def mask(m):
        b = backend.allocate(1)
        b.zero_()
        m.fill_next_token_bitmask(b, 0)
        return b

    plain = mask(backend.matcher(compiled))
    m = AfterReasoning(backend.matcher(compiled), OPENING, start, end)
    opening = mask(m)
    assert (opening != plain).sum() == 1  # the grammar's mask and <think>
    assert m.accept_token(start) and m.accept_token(z) and m.accept_token(z)
    assert bool((mask(m) == -1).all())  # reasoning: everything allowed
    assert m.accept_token(end)
    assert bool((mask(m) == plain).all()) and not m.accept_token(z)  # the answer: the grammar's
    brace = _ids(tok, "{")[0]
    assert m.accept_token(brace)
    m.rollback(2)  # back over "{" and </think>: reasoning again, the grammar at its start
    assert m.phase == REASONING and bool((mask(m) == -1).all())
    assert m.accept_token(end) and bool((mask(m) == plain).all())
    answer = AfterReasoning(backend.matcher(compiled), OPENING, start, end)
    assert not answer.accept_token(z) and answer.phase == OPENING  # refused, nothing changed


def test_without_single_token_tags_the_grammar_holds_from_the_start(tiny):
    """A vocabulary without <think> and </think> as tokens has no reasoning to leave free."""
    plain = Tokenizer(RustTokenizer.from_str(tiny_tokenizer_json(VOCAB)), bos_token="<|im_start|>",
                      eos_token="<|im_end|>")
    eng = _engine(tiny, plain)
    done = _run(eng, [("a", "Hello", _params(plain, "deepseek_r1", 0, Z=9.0))])
    _answer(done["a"].text)
    with pytest.raises(InvalidParameterError, match="after_reasoning"):
        StructuredOutputsParams(json=SCHEMA, after_reasoning="nope")
