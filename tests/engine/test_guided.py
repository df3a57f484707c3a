"""Structured outputs in the engine: every output matches its grammar, at any
temperature, beside unconstrained requests, with speculation, preemption, chunked
prefill and prefix caching on; masks are filled off the engine thread."""

from __future__ import annotations

import json
import random
import threading

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer as RustTokenizer

import llmserve.engine.draft_model as draft_model
from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.grammar import GrammarError
from llmserve.engine.guided import GuidedDecoding
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams, StructuredOutputsParams
from llmserve.engine.spec_decode import rejection_sample
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.tokenizer import Tokenizer
from tests.engine.conftest import make_tiny
from tests.engine.test_sampler import _chi2_ok
from tests.helpers import tiny_tokenizer_json

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny():
    return make_tiny()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(RustTokenizer.from_str(tiny_tokenizer_json(384)), bos_token="<|im_start|>",
                     eos_token="<|im_end|>")


def _engine(tiny, tok, **opts) -> EngineCore:
    return EngineCore(EngineConfig(**opts), tiny.config, tiny.weights, tok)


def _run(eng: EngineCore, reqs: list[tuple[str, str | list[int], SamplingParams]], arrive_late: int = 0) -> dict:
    """Run to completion; the last ``arrive_late`` requests join after 3 steps."""
    early, late = reqs[:len(reqs) - arrive_late], reqs[len(reqs) - arrive_late:]
    for r in early:
        eng.add_request(*r)
    done, steps = {}, 0
    while eng.has_unfinished() or late:
        if steps == 3:
            for r in late:
                eng.add_request(*r)
            late = []
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
        steps += 1
        assert steps < 5000
    return done


def _so(**kw) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kw)


def _valid(text: str) -> dict:
    obj = json.loads(text)  # strict: raw control characters in strings are refused
    jsonschema.validate(obj, SCHEMA)
    return obj


def test_json_schema_outputs_validate_at_temperature_1(tiny, tok):
    eng = _engine(tiny, tok)
    # Seeds 0..39: seeds 3 and 37 sample UTF-16 surrogates as UTF-8 bytes inside "name"
    # unless grammar.py takes them out of xgrammar's string class (their U+FFFDs overran maxLength).
    reqs = [(f"r{i}", "Hello world", SamplingParams(max_tokens=60, temperature=1.0, seed=i,
                                                   structured_outputs=_so(json=SCHEMA))) for i in range(40)]
    done = _run(eng, reqs)
    for i in range(40):
        assert done[f"r{i}"].finish_reason == "stop", done[f"r{i}"].text
        _valid(done[f"r{i}"].text)
    assert len({done[f"r{i}"].text for i in range(12)}) > 6  # sampled, not one forced string
    assert len(eng.guided) == 0  # matchers are dropped when requests finish


@pytest.mark.parametrize("spec,check", [
    (dict(regex=r"[a-c]{3,6}[0-9]"), lambda t: __import__("re").fullmatch(r"[a-c]{3,6}[0-9]", t)),
    (dict(choice=["yes", "no way", "maybe \"so\""]), lambda t: t in ("yes", "no way", "maybe \"so\"")),
    (dict(grammar='root ::= "(" [0-9]+ ("+" [0-9]+)* ")"'),
     lambda t: __import__("re").fullmatch(r"\([0-9]+(\+[0-9]+)*\)", t)),
    (dict(json_object=True), lambda t: isinstance(json.loads(t), dict)),
])
def test_regex_choice_grammar_and_json_object(tiny, tok, spec, check):
    eng = _engine(tiny, tok)
    # A bias towards closing keeps unbounded grammars short on a random model.
    bias = {2: 4.0, **{tok.encode(c)[0]: 4.0 for c in '"}'}}
    reqs = [(f"r{i}", "Hello", SamplingParams(max_tokens=120, temperature=1.0, seed=i, logit_bias=bias,
                                              structured_outputs=_so(**spec))) for i in range(6)]
    done = _run(eng, reqs)
    for out in done.values():
        assert out.finish_reason == "stop" and check(out.text), out.text


def test_unguided_requests_are_unchanged_beside_guided_ones(tiny, tok):
    plain = [(f"p{i}", f"prompt {i} here", SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
             for i in range(3)]
    alone = _run(_engine(tiny, tok), plain)
    guided = [(f"g{i}", "Hello", SamplingParams(max_tokens=60, temperature=1.0, seed=i,
                                                structured_outputs=_so(json=SCHEMA))) for i in range(3)]
    mixed = _run(_engine(tiny, tok), guided + plain, arrive_late=2)
    for rid, out in alone.items():
        assert mixed[rid].token_ids == out.token_ids
    for i in range(3):
        _valid(mixed[f"g{i}"].text)


def _everything_on(tiny, tok, monkeypatch, method: str | None) -> EngineCore:
    opts = dict(block_size=4, max_num_batched_tokens=12, num_kv_blocks=40, enable_prefix_caching=True)
    if method:
        draft = make_tiny(seed=5, layers=1)
        monkeypatch.setattr(draft_model, "_load_draft",
                            lambda cfg, store: LlamaForCausalLM(draft.config, draft.weights))
        opts["speculative_config"] = {"method": method, "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                      "prompt_lookup_max": 4, "adaptive": False,
                                      "model": "draft" if method == "draft" else None}
    return _engine(tiny, tok, **opts)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_with_a_grammar_is_lossless(tiny, tok, monkeypatch, method):
    """Greedy: identical tokens with and without speculation, under preemption (a small
    pool), chunked prefill (a small budget) and prefix caching (a shared prompt)."""
    rng = random.Random(1)
    rep = [rng.randrange(3, 380) for _ in range(10)]
    prompt = rep * 3  # repeats: n-gram lookup proposes
    reqs = [(f"r{i}", prompt + [i + 3], SamplingParams(max_tokens=50, temperature=0,
                                                      structured_outputs=_so(json=SCHEMA))) for i in range(4)]
    reqs.append(("plain", prompt, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)))
    ref = _run(_everything_on(tiny, tok, monkeypatch, None), reqs, arrive_late=2)
    eng = _everything_on(tiny, tok, monkeypatch, method)
    got = _run(eng, reqs, arrive_late=2)
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in ref.items()}
    assert eng.spec.num_draft_tokens > 0
    assert eng.scheduler.num_preemptions > 0
    assert eng.kv.num_free_blocks == eng.kv.num_blocks
    for i in range(4):
        _valid(got[f"r{i}"].text)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_with_a_grammar_samples_valid_outputs(tiny, tok, monkeypatch, method):
    eng = _everything_on(tiny, tok, monkeypatch, method)
    reqs = [(f"r{i}", [5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(max_tokens=60, temperature=1.0, seed=i, n=1,
                                                              structured_outputs=_so(json=SCHEMA)))
            for i in range(6)]
    for out in _run(eng, reqs).values():
        _valid(out.text)


def test_a_refused_draft_is_kept_for_a_draft_distribution_and_cut_for_ngram():
    """The rule of GuidedDecoding.check_drafts, measured: with a draft distribution q the
    refused token must stay (it is rejected, and the residual is drawn), and then the
    first token is distributed as the constrained target p. Cutting it instead is wrong."""
    p = torch.tensor([0.0, 0.5, 0.3, 0.2])  # the grammar refuses token 0
    q = torch.tensor([[0.6, 0.1, 0.1, 0.2]])
    gen = torch.Generator().manual_seed(0)

    def first_tokens(keep: bool, n: int = 6000) -> torch.Tensor:
        counts = torch.zeros(4)
        for _ in range(n):
            x = int(torch.multinomial(q[0], 1, generator=gen))
            drafts = [x] if (p[x] > 0 or keep) else []
            toks, _ = rejection_sample([p, p], drafts, q[:, :] if drafts else None, False, gen)
            counts[toks[0]] += 1
        return counts

    assert _chi2_ok(first_tokens(keep=True), p)
    assert not _chi2_ok(first_tokens(keep=False), p)


def test_ignore_eos_ends_when_the_grammar_completes(tiny, tok):
    eng = _engine(tiny, tok)
    sp = SamplingParams(max_tokens=40, temperature=1.0, seed=0, ignore_eos=True,
                        structured_outputs=_so(choice=["alpha", "beta"]))
    out = _run(eng, [("r", "Hello", sp)])["r"]
    assert out.text in ("alpha", "beta") and out.finish_reason == "stop"


def test_n_copies_share_one_compiled_grammar(tiny, tok):
    eng = _engine(tiny, tok)
    sp = SamplingParams(max_tokens=60, temperature=1.0, structured_outputs=_so(json=SCHEMA))
    a = eng.compile_grammar(sp)
    assert eng.compile_grammar(SamplingParams(structured_outputs=_so(json=json.dumps(SCHEMA)))) is a


@pytest.mark.parametrize("spec,param", [
    (dict(json={"type": "object", "properties": 5}), "structured_outputs.json"),
    (dict(regex="(unclosed"), "structured_outputs.regex"),
    (dict(grammar="root ::= undefined_rule"), "structured_outputs.grammar"),
])
def test_a_grammar_that_does_not_compile_is_the_callers_error(tiny, tok, spec, param):
    eng = _engine(tiny, tok)
    with pytest.raises(GrammarError) as e:
        eng.inputs.process("r", "hi", SamplingParams(structured_outputs=_so(**spec)))
    assert e.value.param == param


def test_structured_outputs_params_need_exactly_one_constraint():
    with pytest.raises(InvalidParameterError):
        StructuredOutputsParams()
    with pytest.raises(InvalidParameterError):
        StructuredOutputsParams(regex="a", choice=["a"])


def test_masks_are_filled_off_the_engine_thread_while_the_model_runs(tiny, tok, monkeypatch):
    eng = _engine(tiny, tok)
    seen = {}
    fill = GuidedDecoding._fill
    forward = eng.runner.execute

    def spy_fill(self, work):
        seen.setdefault("fill", threading.current_thread().name)
        return fill(self, work)

    def spy_forward(plan):
        seen.setdefault("forward", threading.current_thread().name)
        return forward(plan)

    monkeypatch.setattr(GuidedDecoding, "_fill", spy_fill)
    monkeypatch.setattr(eng.runner, "execute", spy_forward)
    _run(eng, [("r", "Hello", SamplingParams(max_tokens=30, temperature=1.0, structured_outputs=_so(json=SCHEMA)))])
    assert seen["fill"].startswith("llmserve-grammar") and seen["forward"] == threading.current_thread().name


def test_no_raw_control_character_in_a_length_bounded_json_string(tiny, tok):
    """xgrammar's minLength / maxLength string rule lets U+0000-U+001F through; grammar.py
    narrows it to JSON's own rule (json.loads refuses raw control characters)."""
    eng = _engine(tiny, tok)
    sp = SamplingParams(structured_outputs=_so(json={"type": "string", "maxLength": 8}))
    compiled = eng.compile_grammar(sp)
    backend = eng.guided.backend
    controls = [i for i, b in enumerate(backend.info.decoded_vocab) if len(b) == 1 and b[0] < 0x20]
    assert controls
    for t in controls:
        m = backend.matcher(compiled)
        assert m.accept_token(tok.encode('"')[0])
        assert not m.accept_token(t), backend.info.decoded_vocab[t]


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 8}, {"type": "string"}])
def test_no_utf16_surrogate_in_a_json_string(schema):
    """ED A0-BF xx is a surrogate (U+D800-U+DFFF) in UTF-8's form: invalid UTF-8, which xgrammar's
    string classes accept; grammar.py's class refuses it and keeps every real character."""
    import xgrammar as xgr

    from llmserve.engine.grammar import schema_ebnf

    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([chr(i) for i in range(32, 127)])).compile_grammar(
        schema_ebnf(xgr, json.dumps(schema)))
    for text, ok in [(b'"\xed\xbf\x9c"', False), (b'"\xed\xa0\x80"', False),
                     ('"\ud7ff\ue000\U0010ffff\u00e9"'.encode(), True)]:
        assert xgr.GrammarMatcher(compiled).accept_string(text) is ok, text


# ---- failure isolation with grammars ----------------------------------------------------------

GUIDED = [(f"g{i}", "Hello", SamplingParams(max_tokens=60, temperature=0, structured_outputs=_so(json=SCHEMA)))
          for i in range(2)]
PLAIN = ("p", "prompt here", SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
BAD = ("bad", "Hello there", SamplingParams(max_tokens=60, temperature=0, structured_outputs=_so(json=SCHEMA)))


def _assert_alone(eng: EngineCore, done: dict, baseline: dict) -> None:
    assert done["bad"].finish_reason == "error" and done["bad"].error
    assert {k: v.token_ids for k, v in done.items() if k != "bad"} == {k: v.token_ids for k, v in baseline.items()}
    assert all(v.error is None for k, v in done.items() if k != "bad")
    for rid, _, _ in GUIDED:
        _valid(done[rid].text)
    assert len(eng.guided) == 0 and eng.kv.usage == 0.0  # its matcher and blocks are gone


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_a_request_whose_logits_turn_nan_fails_alone_beside_grammar_requests(tiny, tok, monkeypatch, spec):
    from tests.engine.faults import poison_logits

    opts = {} if spec is None else {"speculative_config": {"method": spec, "num_speculative_tokens": 3}}
    baseline = _run(_engine(tiny, tok, **opts), GUIDED + [PLAIN])
    eng = _engine(tiny, tok, **opts)
    poison_logits(eng, monkeypatch, lambda r: r.request_id == "bad", after_tokens=2)
    done = _run(eng, GUIDED + [PLAIN, BAD])
    assert "not finite" in done["bad"].error
    _assert_alone(eng, done, baseline)


class _BrokenMatcher:
    """A matcher whose ``method`` raises, as a grammar engine bug would."""

    def __init__(self, m, method: str) -> None:
        self.m, self.method = m, method

    def __getattr__(self, name: str):
        if name == self.method:
            def boom(*a):
                raise RuntimeError("injected grammar failure")
            return boom
        return getattr(self.m, name)


@pytest.mark.parametrize("method", ["fill_next_token_bitmask", "accept_token"])
def test_a_grammar_that_raises_fails_its_own_request_alone(tiny, tok, method):
    baseline = _run(_engine(tiny, tok), GUIDED + [PLAIN])
    eng = _engine(tiny, tok)
    eng.add_request(*BAD)
    eng.guided._matchers["bad"] = _BrokenMatcher(eng.guided._matchers["bad"], method)
    done = _run(eng, GUIDED + [PLAIN])
    _assert_alone(eng, done, baseline)


def test_a_draft_that_ends_the_match_leaves_no_empty_mask_behind_it(tiny, tok):
    """Drafts that complete the grammar with its stop token (prompt lookup copies the chat
    template's <|im_end|>): the rows after the stop were filled from a terminated matcher,
    which allows nothing, and at temperature 1 the whole request failed ("sampling
    distribution is not finite"). Rows past the stop are never sampled: left open."""
    eng = _engine(tiny, tok)
    sp = SamplingParams(max_tokens=8, temperature=1.0, structured_outputs=_so(choice=["yes"]))
    guided = eng.warm_grammar()
    m = guided.matcher(eng.compile_grammar(sp))
    stop = sorted(eng.eos_token_ids)[0]
    answer = tok.encode("yes")
    drafts = [*answer, stop, answer[0]]
    mask = guided.backend.allocate(1 + len(drafts))
    GuidedDecoding._fill_one(m, drafts, mask)
    assert all(bool(row.any()) for row in mask), "a row whose mask allows no token"


@pytest.mark.parametrize("spec", [dict(grammar="root ::= root"), dict(regex=r"[^\s\S]x")])
def test_a_constraint_no_output_can_begin_is_refused_at_compile(tiny, tok, spec):
    with pytest.raises(GrammarError, match="allows no output at all"):
        _engine(tiny, tok).inputs.process("r", "hi", SamplingParams(structured_outputs=_so(**spec)))


@pytest.mark.parametrize("schema", [{"type": "number", "multipleOf": 0.5}, {"not": {"type": "string"}},
                                    {"type": "object", "properties": {}, "required": ["x"]}])
def test_a_schema_the_grammar_would_not_enforce_is_refused(tiny, tok, schema):
    with pytest.raises(GrammarError, match="is not supported") as e:
        _engine(tiny, tok).inputs.process("r", "hi", SamplingParams(structured_outputs=_so(json=schema)))
    assert e.value.param == "structured_outputs.json"


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_a_constraint_that_reaches_a_dead_end_fails_its_request_alone(tiny, tok, spec):
    """``ab`` then an empty class: after two characters no token may follow. That request
    ends with the dead end named (the API's 400 invalid_grammar), the others as alone."""
    from llmserve.engine.sampler import DEAD_END

    opts = {} if spec is None else {"speculative_config": {"method": spec, "num_speculative_tokens": 3}}
    baseline = _run(_engine(tiny, tok, **opts), GUIDED + [PLAIN])
    eng = _engine(tiny, tok, **opts)
    dead = ("bad", "Hello there", SamplingParams(max_tokens=20, temperature=0,
                                                 structured_outputs=_so(regex=r"ab[^\s\S]")))
    done = _run(eng, GUIDED + [PLAIN, dead])
    assert DEAD_END in done["bad"].error and done["bad"].text == "ab"
    _assert_alone(eng, done, baseline)
