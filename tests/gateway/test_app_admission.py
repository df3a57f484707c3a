"""Admission through the live gateway: realtime first, batch share, caps, deadlines."""

import asyncio

import httpx
import pytest

from llmserve.priority import PriorityClass

from .app_harness import stack, wait_until
from .fake_upstream import Behaviour


async def _post(client: httpx.AsyncClient, content: str, priority: str | None = None):
    body = {"model": "chat", "messages": [{"role": "user", "content": content}]}
    headers = {"x-priority": priority} if priority else {}
    return await client.post("/v1/chat/completions", json=body, headers=headers)


@pytest.mark.parametrize("share,expected", [
    (0.0, ["hold", "r1", "r2", "b1", "b2"]),
    (0.5, ["hold", "r1", "b1", "r2", "b2"]),
])
async def test_realtime_first_and_batch_gets_its_share(share, expected):
    slow = Behaviour("a", tokens=1, first_token_delay_s=0.15)
    model = {"concurrency": {"fixed": 1}, "admission": {"batch_min_share": share}}
    with stack({"v1": [slow]}, model=model) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            hold = asyncio.create_task(_post(c, "hold"))
            await asyncio.to_thread(wait_until, lambda: slow.running == 1)
            tasks = []
            for name, prio in (("b1", "batch"), ("b2", "batch"), ("r1", None), ("r2", None)):
                tasks.append(asyncio.create_task(_post(c, name, prio)))
                await asyncio.sleep(0.02)  # queue in this order
            results = await asyncio.gather(hold, *tasks)
        assert all(r.status_code == 200 for r in results)
        order = [b["messages"][0]["content"] for b in slow.bodies]
        assert order == expected
        assert slow.max_running == 1


async def test_caps_answer_429_and_deadlines_503():
    slow = Behaviour("a", tokens=1, first_token_delay_s=1.0)
    model = {"concurrency": {"fixed": 1},
             "admission": {"realtime": {"max_queue": 1, "deadline_s": 0.3},
                           "batch": {"max_queue": 5, "deadline_s": 60}}}
    with stack({"v1": [slow]}, model=model) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            hold = asyncio.create_task(_post(c, "hold"))
            await asyncio.to_thread(wait_until, lambda: slow.running == 1)
            queued = asyncio.create_task(_post(c, "r1"))
            await asyncio.sleep(0.05)
            rejected = await _post(c, "r2")
            assert rejected.status_code == 429
            assert rejected.json()["error"]["code"] == "queue_full"
            assert int(rejected.headers["retry-after"]) >= 1
            timed_out = await queued
            assert timed_out.status_code == 503
            err = timed_out.json()["error"]
            assert err["code"] == "queue_timeout" and "deadline" in err["message"]
            assert int(timed_out.headers["retry-after"]) >= 1
            assert (await hold).status_code == 200
        metrics = s.client.get("/metrics").text
        assert 'kind="queue_full"' in metrics and 'kind="queue_timeout"' in metrics
        assert [b["messages"][0]["content"] for b in slow.bodies] == ["hold"]


async def test_requests_wait_for_room_instead_of_overloading():
    a = Behaviour("a", tokens=1, first_token_delay_s=0.05)
    with stack({"v1": [a]}, model={"concurrency": {"fixed": 2}}) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            results = await asyncio.gather(*[_post(c, f"q{i}") for i in range(10)])
        assert all(r.status_code == 200 for r in results)
        assert a.max_running <= 2 and a.requests == 10
        assert "llmserve:gateway_queue_time_seconds_count" in s.client.get("/metrics").text


async def test_a_client_that_leaves_the_queue_never_takes_a_slot():
    slow = Behaviour("a", tokens=1, first_token_delay_s=0.6)
    with stack({"v1": [slow]}, model={"concurrency": {"fixed": 1}}) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            hold = asyncio.create_task(_post(c, "hold"))
            await asyncio.to_thread(wait_until, lambda: slow.running == 1)
            async with httpx.AsyncClient(base_url=s.url, timeout=0.2) as impatient:
                with pytest.raises(httpx.ReadTimeout):
                    await _post(impatient, "gone")
            pool = s.gateway.pool("chat", "v1")
            await asyncio.to_thread(
                wait_until, lambda: pool.queue_stats()[PriorityClass.REALTIME].removed == 1)
            assert (await hold).status_code == 200
            assert (await _post(c, "next")).status_code == 200
        assert [b["messages"][0]["content"] for b in slow.bodies] == ["hold", "next"]
