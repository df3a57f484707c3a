"""Which replica decides a canary: the leader of one pool every replica names alike."""

from __future__ import annotations

from llmserve.serve.leases import canary_pool

POOLS = ["chat/v1", "chat/v2", "org/model/a", "org/model/b"]


def test_the_canary_versions_pool_decides():
    assert canary_pool("chat", "v2", POOLS) == "chat/v2"


def test_without_a_canary_pool_the_models_first_one_does():
    assert canary_pool("chat", "v9", list(reversed(POOLS))) == "chat/v1"
    assert canary_pool("org/model", None, POOLS) == "org/model/a"  # a name with a slash
    assert canary_pool("other", "v2", POOLS) is None
