"""A family whose config.json names its sizes differently (GPT-2's ``n_embd``, ``n_layer``)
is refused by name, not with a KeyError: the family is checked before any size is read, so
``llmserve pull`` and the server's start refuse it in one line."""

from __future__ import annotations

import json

import pytest

from llmserve.models.families import SUPPORTED_MODEL_TYPES
from llmserve.models.hf_loader import read_hf_config
from llmserve.models.loader import UnsupportedFamily
from llmserve.models.model_source import refuse_unsupported

GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 1, "n_head": 2,
        "n_positions": 64, "vocab_size": 384}


def test_a_config_with_other_keys_is_refused_by_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GPT2))
    with pytest.raises(UnsupportedFamily) as e:
        read_hf_config(tmp_path)
    assert "model family 'gpt2' is not supported" in str(e.value)
    assert all(name in str(e.value) for name in SUPPORTED_MODEL_TYPES)
    with pytest.raises(UnsupportedFamily):
        refuse_unsupported(tmp_path)  # what pull and the server's start call
