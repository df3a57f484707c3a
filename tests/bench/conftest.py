from __future__ import annotations

import pytest

from .fakes import ServerStats, ServerThread, build_tiny_tokenizer, make_fake_openai_app


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def fake_server():
    """A fresh fake OpenAI server per test, so its counters belong to that test."""
    stats = ServerStats()
    with ServerThread(make_fake_openai_app(stats)) as srv:
        srv.stats = stats
        yield srv
