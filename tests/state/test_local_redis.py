"""serve --replicas' own redis-server: started again on its port and password when it dies,
so a replica that exits meanwhile can start again (its start needs the store)."""

from __future__ import annotations

import asyncio
import signal

from llmserve.state.local_redis import LocalRedis
from llmserve.state.redis_conn import connect
from tests.redis_server import redis_binary


def _pings(r: LocalRedis) -> bool:
    async def ping() -> bool:
        conn = await connect(r.url, r.password_file)
        await conn.aclose()
        return True
    return asyncio.run(ping())


def test_a_dead_redis_is_started_again_where_the_replicas_look(tmp_path):
    redis_binary()  # (skips without one, fails in CI)
    r = LocalRedis(tmp_path / "redis").start()
    try:
        url, password = r.url, r.password_file.read_text()
        assert not r.revive()  # alive: nothing to do
        r.proc.send_signal(signal.SIGKILL)
        r.proc.wait(10)
        assert r.revive()
        assert r.url == url and r.password_file.read_text() == password and _pings(r)
    finally:
        r.stop()
