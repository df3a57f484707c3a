"""The instance's priority rule without an engine: its configured range, else 400."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmserve.priority import PriorityRange
from llmserve.server.config import ServerConfig
from llmserve.api.errors import APIError
from llmserve.server.serving import OpenAIServing


def _serving(**config) -> OpenAIServing:
    return OpenAIServing(SimpleNamespace(tokenizer=None), ServerConfig(**config), "m")


def _raw(**headers) -> SimpleNamespace:
    return SimpleNamespace(headers=headers)


def test_the_default_range_is_the_two_named_levels():
    s = _serving()
    assert s.priority(None, _raw()) is None  # the engine's default (realtime) applies
    assert s.priority("batch", _raw()) == 1
    assert s.priority(None, _raw(**{"x-priority": "0"})) == 0
    assert s.priority(1, _raw(**{"x-priority": "-5"})) == 1  # the body wins over the header
    for bad in (-1, 2, -1000000000, "1" * 5000, "urgent", True, 1.0):
        with pytest.raises(APIError) as e:
            s.priority(bad, _raw())
        assert (e.value.status, e.value.param) == (400, "priority")


def test_a_configured_range_is_trusted_whole():
    s = _serving(priority_range=PriorityRange(-5, 5))
    assert s.priority(-5, _raw()) == -5
    assert s.priority(None, _raw(**{"x-priority": "5"})) == 5
    with pytest.raises(APIError):
        s.priority(-6, _raw())


def test_the_cli_flag_sets_the_range():
    import argparse

    from llmserve.cli import add_server_args
    from llmserve.flags import config_from
    from llmserve.priority import NAMED_RANGE, PriorityRange
    from llmserve.server.config import ServerConfig

    p = argparse.ArgumentParser()
    add_server_args(p)
    wide = config_from(ServerConfig, p.parse_args(["--priority-range", "-10", "10"]))
    assert wide.priority_range == PriorityRange(-10, 10)
    assert config_from(ServerConfig, p.parse_args([])).priority_range == NAMED_RANGE
