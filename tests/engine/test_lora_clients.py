"""The in-thread client's LoRA commands (the process client's run in tests/server/test_lora_api.py),
token-exact resume on an adapter, and ``--lora-modules`` parsing."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.in_thread import InThreadEngine
from llmserve.engine.lora.manager import UnknownAdapter
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.lora.adapter import LoraError
from tests.engine.conftest import make_tiny
from tests.family_models import hf_greedy
from tests.lora_adapters import make_adapter

PROMPT = [4, 8, 15, 16, 23, 42]
SP = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    t = make_tiny(seed=2)
    root = tmp_path_factory.mktemp("clients")
    merged = make_adapter(t.hf, root / "a", 8, ["q_proj", "up_proj"], seed=3)
    return t, root, merged


def test_in_thread_load_serve_unload(tiny):
    t, root, merged = tiny

    async def go():
        eng = InThreadEngine(EngineCore(EngineConfig(dtype="fp32", num_kv_blocks=32, enable_lora=True),
                                        t.config, t.weights))
        try:
            assert eng.lora["adapters"] == {}
            await eng.load_lora("a", str(root / "a"))
            assert eng.lora["adapters"] == {"a": str(root / "a")}
            with pytest.raises(LoraError, match="already loaded"):
                await eng.load_lora("a", str(root / "a"))
            with pytest.raises(LoraError, match="no such adapter"):
                await eng.load_lora("b", str(root / "nowhere"))
            outs = [o async for o in eng.generate(PROMPT, SP, lora_name="a")]
            assert outs[-1].outputs[0].token_ids == hf_greedy(merged, PROMPT, 10)[0]
            assert eng.load_snapshot()["lora_adapters"] == ["a"]
            await eng.unload_lora("a")
            with pytest.raises(UnknownAdapter):
                await eng.unload_lora("a")
            assert eng.lora["adapters"] == {}
        finally:
            eng.shutdown()

    asyncio.run(go())


def test_resume_on_an_adapter_continues_token_exactly(tiny):
    t, root, merged = tiny
    eng = EngineCore(EngineConfig(dtype="fp32", num_kv_blocks=32, lora_modules={"a": str(root / "a")}),
                     t.config, t.weights)
    want = hf_greedy(merged, PROMPT, 10)[0]
    eng.add_request("r", PROMPT, SP, lora_name="a", resume_token_ids=want[:4])
    done = {}
    while eng.has_unfinished():
        done.update({o.request_id: o.outputs[0].token_ids for o in eng.step() if o.finished})
    assert done["r"][-6:] == want[4:]


def test_a_request_on_an_unknown_adapter_is_refused_whole(tiny):
    t, root, _ = tiny
    eng = EngineCore(EngineConfig(dtype="fp32", num_kv_blocks=32, enable_lora=True), t.config, t.weights)
    with pytest.raises(ValueError, match="'zz' is not loaded"):
        eng.add_request("r", PROMPT, SP, lora_name="zz")
    assert not eng.has_unfinished()


@pytest.mark.parametrize("given", [["a"], ["=p"], ["a=p", "a=q"]])
def test_lora_modules_must_be_name_equals_path(given):
    with pytest.raises(ValidationError, match="lora_modules"):
        EngineConfig(lora_modules=given)
    assert EngineConfig(lora_modules=["a=/x", "b=/y=z"]).lora_modules == {"a": "/x", "b": "/y=z"}
