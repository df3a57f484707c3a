"""Client privileges, purely: what a key may claim, and the config that says so."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from llmserve.gateway.auth import ClientAuth, Privileges, grant_priority
from llmserve.gateway.config import AuthConfig
from llmserve.gateway.errors import GatewayError
from llmserve.priority import WIRE_MAX, WIRE_MIN, PriorityClass

RT, BATCH = PriorityClass.REALTIME, PriorityClass.BATCH
DEFAULT = Privileges.build(RT)
BATCH_ONLY = Privileges.build(BATCH)
OPS = Privileges.build(RT, integers=(-10, 10), version_override=True)


def test_by_default_a_client_may_use_its_default_class_and_every_less_urgent_one():
    assert DEFAULT.classes == {RT, BATCH} and BATCH_ONLY.classes == {BATCH}
    assert not DEFAULT.version_override and DEFAULT.integers is None
    with pytest.raises(ValueError, match="not among"):
        Privileges.build(RT, classes=[BATCH])


@pytest.mark.parametrize("privileges,claim,granted", [
    (DEFAULT, None, 0), (DEFAULT, 0, 0), (DEFAULT, 1, 1), (DEFAULT, -1000000000, 0), (DEFAULT, 7, 1),
    (BATCH_ONLY, None, 1), (BATCH_ONLY, 0, 1), (BATCH_ONLY, -1000000000, 1), (BATCH_ONLY, 9, 1),
    (OPS, -10, -10), (OPS, 10, 10), (OPS, -11, 0), (OPS, 11, 1), (OPS, None, 0),
    (Privileges.build(BATCH, integers=(-5, 5)), -3, 1),  # an integer of a class it may not use
])
def test_grant_priority(privileges, claim, granted):
    assert grant_priority(claim, privileges) == granted


@given(st.sampled_from([DEFAULT, BATCH_ONLY, OPS]), st.none() | st.integers(WIRE_MIN, WIRE_MAX))
def test_a_grant_never_leaves_the_clients_privileges(privileges, claim):
    granted = grant_priority(claim, privileges)
    assert PriorityClass.of(granted) in privileges.classes
    allowed = {c.level for c in privileges.classes}
    assert granted in allowed or (privileges.integers is not None and granted == claim
                                  and granted in privileges.integers)


def test_client_auth_names_the_matching_keys_privileges():
    auth = ClientAuth({"key-one-0123": DEFAULT, "key-ops-0123": OPS}, DEFAULT)
    assert auth.identify("Bearer key-ops-0123") is OPS
    assert auth.identify("bearer  key-one-0123 ") is DEFAULT
    for bad in (None, "", "Bearer key-ops-01234", "key-ops-0123", "Basic key-ops-0123"):
        with pytest.raises(GatewayError) as e:
            auth.identify(bad)
        assert e.value.status == 401
    assert ClientAuth({}, OPS).identify(None) is OPS  # an open gateway: everyone's privileges


def test_auth_config_shape():
    cfg = AuthConfig.model_validate({
        "api_keys": ["plain-key-0123"],
        "keys": [{"key": "ops-key-0123", "priority_range": [-10, 10], "version_override": True},
                 {"key": "batch-key-0123", "priorities": ["Batch"], "default_priority": "batch"}],
        "default_priority": "realtime"})
    auth = cfg.client_auth()
    assert auth.identify("Bearer plain-key-0123") == DEFAULT
    assert auth.identify("Bearer ops-key-0123") == OPS
    assert auth.identify("Bearer batch-key-0123") == BATCH_ONLY
    open_cfg = AuthConfig.model_validate({"default_priority": "batch"}).client_auth()
    assert open_cfg.identify(None) == BATCH_ONLY  # open, and nobody may claim realtime


@pytest.mark.parametrize("bad,match", [
    ({"api_keys": ["short"]}, "at least 8"),
    ({"keys": [{"key": "short"}]}, "at least 8"),
    ({"api_keys": ["same-key-0123"], "keys": [{"key": "same-key-0123"}]}, "twice"),
    ({"keys": [{"key": "k-0123456", "priorities": ["batch"]}]}, r"keys\[0\].*not among"),
    ({"keys": [{"key": "k-0123456", "priorities": ["urgent"]}]}, "realtime' or 'batch"),
    ({"keys": [{"key": "k-0123456", "priority_range": [5, -5]}]}, "empty"),
    ({"keys": [{"key": "k-0123456", "priority_range": [0, 2**40]}]}, "outside"),
    ({"open_privileges": {"priorities": ["batch"]}}, "open_privileges.*not among"),
    ({"keys": [{"key": "k-0123456", "priorites": ["batch"]}]}, "priorites"),
])
def test_auth_config_mistakes_show_at_load(bad, match):
    with pytest.raises(ValidationError, match=match):
        AuthConfig.model_validate(bad)
