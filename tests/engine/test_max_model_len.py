"""An explicit max_model_len is honoured or refused, never silently cut (as vLLM): longer
than the model's context, or than the KV cache holds for one request, is an error at start;
unset, it is whatever both allow."""

from __future__ import annotations

import pytest

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from tests.engine.conftest import make_tiny


@pytest.fixture(scope="module")
def tiny():
    return make_tiny()


def _core(tiny, **opts) -> EngineCore:
    return EngineCore(EngineConfig(dtype="fp32", **opts), tiny.config, tiny.weights)


def test_an_explicit_length_is_kept_or_refused(tiny):
    assert _core(tiny, max_model_len=300).max_model_len == 300
    with pytest.raises(ValueError, match="longer than the model's context \\(512 tokens\\)"):
        _core(tiny, max_model_len=1000)
    with pytest.raises(ValueError, match="does not fit the KV cache, which holds"):
        _core(tiny, max_model_len=400, num_kv_blocks=8, block_size=16)


def test_unset_it_is_what_the_model_and_the_pool_allow(tiny):
    assert _core(tiny).max_model_len == 512
    small = _core(tiny, num_kv_blocks=8, block_size=16)
    assert small.max_model_len == small.kv.token_capacity <= 128
