"""Residency: what the gateway knows of an instance's adapters between its load reports,
and the one shared load per adapter and instance (gateway/adapter_load.py)."""

import asyncio

import pytest

from llmserve.gateway.adapter_load import CLAIM_TTL_S, Residency

from .conftest import load_report


def _report(resident=(), loaded=()):
    return load_report(lora_adapters=list(resident), lora_adapters_loaded=list(loaded))


def test_the_report_is_the_view_until_the_gateway_does_something():
    r = Residency()
    assert r.view(_report(["a"], ["b"]), 0.0, 1.0) == ({"a"}, {"b"})
    assert r.view(None, 0.0, 1.0) == (frozenset(), frozenset())


async def test_our_load_counts_until_a_report_asked_for_after_it():
    r = Residency()
    calls = []

    async def load():
        calls.append(1)

    await r.ensure("x", False, load)
    assert calls == [1] and "x" in r.view(_report(), asked_at=0.0, now=1.0)[1]  # report older than the load
    assert "x" not in r.view(_report(), asked_at=1e12, now=1e12)[1]  # a newer report without it: evicted
    await r.ensure("x", True, load)  # resident by the report: no load
    assert calls == [1]


async def test_concurrent_requests_share_one_load_and_a_failure_reaches_them_all():
    r = Residency()
    gate, calls = asyncio.Event(), []

    async def load():
        calls.append(1)
        await gate.wait()

    waiters = [asyncio.ensure_future(r.ensure("x", False, load)) for _ in range(5)]
    await asyncio.sleep(0)
    assert "x" in r.view(_report(), 0.0, 0.0)[1]  # being loaded: followers route here
    waiters[0].cancel()  # one client leaving does not cancel the others' load
    gate.set()
    await asyncio.gather(*waiters[1:])
    assert calls == [1]

    async def broken():
        raise RuntimeError("refused")
    failing = [asyncio.ensure_future(r.ensure("y", False, broken)) for _ in range(3)]
    results = await asyncio.gather(*failing, return_exceptions=True)
    assert all(isinstance(e, RuntimeError) for e in results)
    assert "y" not in r.view(_report(), 0.0, 0.0)[1]


def test_a_claim_routes_followers_until_it_expires():
    r = Residency()
    r.claim("x", now=10.0)
    assert "x" in r.view(_report(), 0.0, 10.0)[1]
    assert "x" not in r.view(_report(), 0.0, 10.0 + CLAIM_TTL_S)[1]


@pytest.mark.parametrize("where", ["resident", "loaded"])
async def test_an_instance_that_denied_an_adapter_lacks_it_until_a_newer_report(where):
    r = Residency()
    rep = _report(["x"]) if where == "resident" else _report((), ["x"])
    r.gone("x", now=5.0)
    assert "x" not in r.view(rep, asked_at=4.0, now=5.5)[0] | r.view(rep, asked_at=4.0, now=5.5)[1]
    calls = []

    async def load():
        calls.append(1)
    await r.ensure("x", True, load)  # the report says so, but the instance denied it: load again
    assert calls == [1]
    r.gone("x", now=6.0)
    assert "x" in (r.view(rep, asked_at=7.0, now=7.0)[0] | r.view(rep, asked_at=7.0, now=7.0)[1])


async def test_an_adapter_the_instance_registered_needs_no_path_when_evicted():
    """A ``--lora-modules`` adapter out of the instance's memory is still served by name (the
    instance reads it again): a path-less adapter version must not fail as 'not resident'."""
    from types import SimpleNamespace

    from llmserve.gateway.adapter_load import AdapterLoadFailed, ensure_adapter
    from llmserve.gateway.config import AdapterConfig

    adapter = AdapterConfig(name="sql")
    inst = SimpleNamespace(instance_id="i1", url="http://127.0.0.1:1", residency=Residency(), report_asked_at=0.0,
                           report=load_report(lora_adapters_registered=["sql"]))
    await ensure_adapter(None, inst, adapter, {})  # no load: nothing posted (the client is None)
    inst.report = load_report()
    with pytest.raises(AdapterLoadFailed, match="no path to load it from"):
        await ensure_adapter(None, inst, adapter, {})
