"""One bad request never hurts another: a request whose scheduling, sampling or text
fails is failed alone, and the others produce exactly the tokens they would have
produced without it. Only a fault of the whole batch kills the engine.

Each poisoned run is compared with a run of the same engine setup without the
poison: greedy and seeded requests are reproducible, so "the same tokens" is exact.
"""

from __future__ import annotations

import asyncio

import pytest

from llmserve.engine.client import EngineDeadError, RequestFailedError
from llmserve.engine.in_thread import InThreadEngine
from llmserve.engine.config import EngineConfig
from llmserve.engine.llm import build_engine
from llmserve.engine.sampling_params import SamplingParams
from tests.engine.faults import break_detokenizer, break_forward, poison_logits
from tests.engine.test_scheduler import _Unhashable
from tests.helpers import make_tiny_llama

PROMPTS = {"a": [5, 6, 7, 8, 9, 10], "b": [11, 12, 13], "c": [20, 21, 22, 23, 24, 25, 26, 27, 28]}
POISON = [40, 41, 42, 43, 44]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
# The per-row path: seeded sampling and penalties, reproducible whatever else is in the batch.
MIXED = {"a": GREEDY,
         "b": SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
         "c": SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.3, ignore_eos=True)}


def _finish(engine) -> dict:
    finals = {}
    for _ in range(1000):
        if not engine.has_unfinished():
            return finals
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    raise AssertionError("the engine did not finish")


def _run(engine, params: dict, poison: SamplingParams | None = None, salt=None) -> dict:
    for rid, ids in PROMPTS.items():
        engine.add_request(rid, ids, params[rid])
    if poison is not None:
        engine.add_request("poison", POISON, poison, cache_salt=salt)
    return _finish(engine)


def _assert_unharmed(engine, finals: dict, baseline: dict) -> None:
    assert {r: finals[r].outputs[0].token_ids for r in PROMPTS} == {r: baseline[r].outputs[0].token_ids
                                                                    for r in PROMPTS}
    assert all(finals[r].error is None and finals[r].finish_reason == "length" for r in PROMPTS)
    assert not engine.has_unfinished() and engine.kv.usage == 0.0  # the poison's blocks came back


@pytest.mark.parametrize("case", ["greedy", "mixed", "ngram", "draft"])
def test_a_request_whose_logits_turn_nan_fails_alone(tiny, monkeypatch, case):
    params = MIXED if case == "mixed" else dict.fromkeys(PROMPTS, GREEDY)
    poison = MIXED["b"] if case == "mixed" else GREEDY
    opts = dict(num_kv_blocks=64, block_size=4)
    if case in ("ngram", "draft"):
        opts["speculative_config"] = {"method": case, "num_speculative_tokens": 3}
        if case == "draft":
            opts["speculative_config"]["model"] = "self"
            import llmserve.engine.draft_model as draft_model
            from llmserve.models.llama import LlamaForCausalLM

            monkeypatch.setattr(draft_model, "_load_draft",
                                lambda cfg, store: LlamaForCausalLM(tiny.config, tiny.weights))
    baseline = _run(tiny.engine(**opts), params)
    eng = tiny.engine(**opts)
    shared = poison_logits(eng, monkeypatch, lambda r: r.prompt_token_ids == POISON, after_tokens=3)
    finals = _run(eng, params, poison)
    bad = finals["poison"]
    assert bad.finished and bad.finish_reason == "error"
    assert "sampling failed" in bad.error and "not finite" in bad.error
    assert len(bad.outputs[0].token_ids) >= 3  # it generated, then failed mid-stream
    assert shared and all(len(batch) > 1 for batch in shared)  # it failed inside a shared step
    _assert_unharmed(eng, finals, baseline)


@pytest.mark.parametrize("fail_on,where", [(1, "scheduling failed"), (2, "applying the step failed")])
def test_a_salt_that_cannot_be_hashed_fails_alone(tiny, fail_on, where):
    baseline = _run(tiny.engine(num_kv_blocks=64, block_size=4), dict.fromkeys(PROMPTS, GREEDY))
    eng = tiny.engine(num_kv_blocks=64, block_size=4)
    finals = _run(eng, dict.fromkeys(PROMPTS, GREEDY), GREEDY, salt=_Unhashable("s", fail_on))
    assert finals["poison"].finish_reason == "error" and where in finals["poison"].error
    _assert_unharmed(eng, finals, baseline)


def test_a_lone_surrogate_salt_is_served_and_keeps_its_own_cache(tiny):
    eng = tiny.engine(num_kv_blocks=64, block_size=4)
    prompt = list(range(30, 46))
    runs = []
    for salt in (None, "\ud800", "\ud800"):
        eng.add_request(f"r{len(runs)}", prompt, GREEDY, cache_salt=salt)
        runs.append(_finish(eng)[f"r{len(runs)}"])
    assert all(r.error is None for r in runs)
    assert runs[0].outputs[0].token_ids == runs[1].outputs[0].token_ids == runs[2].outputs[0].token_ids
    # the salted request does not see the unsalted one's blocks, but does see its own
    assert runs[1].num_cached_tokens == 0 and runs[2].num_cached_tokens > 0


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=256)


def _core(path):
    return build_engine(EngineConfig(model=str(path), num_kv_blocks=64, block_size=4))


def test_a_failing_detokenizer_fails_alone(tiny_path, monkeypatch):
    params = dict.fromkeys(PROMPTS, GREEDY)
    baseline = _run(_core(tiny_path), params)
    eng = _core(tiny_path)
    break_detokenizer(eng, monkeypatch, POISON, after_calls=2)
    finals = _run(eng, params, GREEDY)
    assert finals["poison"].finish_reason == "error" and "detokenisation failed" in finals["poison"].error
    _assert_unharmed(eng, finals, baseline)
    assert {r: finals[r].outputs[0].text for r in PROMPTS} == {r: baseline[r].outputs[0].text for r in PROMPTS}


def test_a_forward_failure_is_a_batch_fault(tiny, monkeypatch):
    eng = tiny.engine(num_kv_blocks=64)
    eng.add_request("a", PROMPTS["a"], GREEDY)
    break_forward(eng, monkeypatch)
    with pytest.raises(RuntimeError, match="injected forward failure"):
        eng.step()


async def _collect(stream):
    outs = [o async for o in stream]
    return outs[-1]


async def test_the_async_stream_of_a_failed_request_raises_and_the_others_finish(tiny_path, monkeypatch):
    baseline = _run(_core(tiny_path), dict.fromkeys(PROMPTS, GREEDY))
    core = _core(tiny_path)
    poison_logits(core, monkeypatch, lambda r: r.prompt_token_ids == POISON, after_tokens=2)
    eng = InThreadEngine(core)
    try:
        streams = [eng.add_request(ids, GREEDY, rid) for rid, ids in PROMPTS.items()]
        streams.append(eng.add_request(POISON, GREEDY, "poison"))
        results = await asyncio.gather(*(_collect(s) for s in streams), return_exceptions=True)
        err = results[-1]
        assert isinstance(err, RequestFailedError) and "not finite" in str(err)
        assert err.output.request_id == "poison" and len(err.output.outputs[0].token_ids) == 2
        assert [o.outputs[0].token_ids for o in results[:-1]] == [baseline[r].outputs[0].token_ids
                                                                  for r in PROMPTS]
        assert eng.is_alive() and eng.death is None
        again = await _collect(eng.add_request(PROMPTS["a"], GREEDY, "again"))
        assert again.outputs[0].token_ids == baseline["a"].outputs[0].token_ids
    finally:
        eng.shutdown()


async def test_a_batch_failure_kills_the_engine_and_ends_every_stream(tiny_path, monkeypatch):
    core = _core(tiny_path)
    eng = InThreadEngine(core)
    try:
        break_forward(core, monkeypatch)
        streams = [eng.add_request(ids, GREEDY, rid) for rid, ids in PROMPTS.items()]
        results = await asyncio.gather(*(_collect(s) for s in streams), return_exceptions=True)
        assert all(isinstance(r, EngineDeadError) and "injected forward failure" in str(r) for r in results)
        assert not eng.is_alive() and "injected forward failure" in eng.death
        assert not core.has_unfinished() and core.kv.usage == 0.0
        with pytest.raises(EngineDeadError):
            eng.add_request(PROMPTS["a"], GREEDY)
        with pytest.raises(EngineDeadError):
            await eng.call(lambda c: c.load_snapshot())
    finally:
        eng.shutdown()


async def test_a_crashed_engine_loop_ends_every_stream(tiny_path, monkeypatch):
    core = _core(tiny_path)
    eng = InThreadEngine(core)
    try:
        stream = eng.add_request(PROMPTS["a"], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
        first = await stream.__anext__()
        assert not first.finished

        def boom():
            raise MemoryError("injected loop failure")

        monkeypatch.setattr(core, "has_unfinished", boom)  # outside step(): the loop itself dies
        with pytest.raises(EngineDeadError, match="loop crashed"):
            async for _ in stream:
                pass
        assert not eng.is_alive() and "injected loop failure" in eng.death
    finally:
        eng.shutdown()
