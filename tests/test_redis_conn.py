"""The shared store's connection: authenticated or refused with one clear line."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.state.redis_conn import StoreError, connect, redact


def test_connects_with_the_password_and_round_trips(redis_server):
    async def go():
        r = await connect(redis_server.url)
        await r.set("k", "v")
        assert await r.get("k") == "v"
        await r.aclose()
    asyncio.run(go())


def test_password_from_a_file(redis_server, tmp_path):
    f = tmp_path / "pw"
    f.write_text(redis_server.password + "\n")
    async def go():
        r = await connect(redis_server.url_without_password, f)
        assert await r.ping()
        await r.aclose()
    asyncio.run(go())


def test_an_open_url_is_refused_before_connecting(redis_server):
    with pytest.raises(StoreError, match="open Redis is refused"):
        asyncio.run(connect(redis_server.url_without_password))


def test_a_wrong_password_is_one_clear_line(redis_server):
    bad = redis_server.url.replace(redis_server.password, "wrong")
    with pytest.raises(StoreError, match="refused our credentials") as e:
        asyncio.run(connect(bad))
    assert "wrong" not in str(e.value) and "\n" not in str(e.value)


def test_unreachable_is_a_store_error(redis_server):
    redis_server.stop()
    with pytest.raises(StoreError, match="unreachable"):
        asyncio.run(connect(redis_server.url, timeout_s=0.3))


def test_redact_hides_the_password():
    assert redact("redis://:s3cret@h:1/0") == "redis://:***@h:1/0"
    assert "s3cret" not in redact("redis://user:s3cret@h:1/0")
