"""The simulator's speed-up changes no outcome: the golden runs give exactly what the
code before it gave (``tests/sim/golden/outcomes.json``, written by that code)."""

from __future__ import annotations

import json

import pytest

from tests.sim.golden_runs import GOLDEN, cases, fingerprint

_GOLDEN = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(_GOLDEN))
def test_same_decisions_and_outcomes_as_before(name: str) -> None:
    got = fingerprint(cases()[name])
    want = _GOLDEN[name]
    assert got["events"] == want["events"]
    assert got["lifetimes"] == want["lifetimes"]
    assert got["summary"] == want["summary"]
    for key in ("status", "ttft", "e2e", "timeline"):
        assert got[key] == want[key], f"{name}: per-request {key} changed"
