"""Three real gateway processes against one real (password-protected) Redis, in front of a
fake instance: one key's limits hold across them all, a budget is never exceeded by
more than one request's tokens, and with Redis killed each replica enforces its 1/3
share alone (and says so) until Redis is back.

The windows are short (``requests`` per ``window_s``): ``requests_per_minute`` is the
same limit with a 60 s window (tests/gateway/tenants/test_decision.py checks any window)."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from tests.gateway.app_harness import ADMIN_KEY, FAST_POLLING, bearer, wait_until
from tests.gateway.fake_upstream import Behaviour, ServerThread, free_port, make_app

pytestmark = pytest.mark.slow

RATE_KEY, BUDGET_KEY, SHARE_KEY = "rate-key-0123456", "budget-key-0123456", "share-key-0123456"
WINDOW_S = 10.0  # longer than any burst below takes, so a burst lies within one window
BUDGET = 300


class Replica:
    """``llmserve gateway --config`` as a user runs it, on a free port."""

    def __init__(self, config_path: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "llmserve.cli", "gateway", "--config",
                                          str(config_path), "--port", str(self.port), "--log-level", "warning"],
                                         stdout=out, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def ready(self) -> dict | None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"gateway exited:\n{self.log.read_text()}")
        try:
            r = self.client.get("/ready")
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def chat(self, key: str, **body) -> httpx.Response:
        return self.client.post("/v1/chat/completions", headers=bearer(key), json={
            "model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})

    def usage(self, name: str) -> dict:
        return self.client.get(f"/admin/keys/{name}/usage", headers=bearer(ADMIN_KEY)).json()

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)


@pytest.fixture
def replicas(redis_server, tmp_path):
    fake = ServerThread(make_app(Behaviour("a", tokens=4, max_num_seqs=64))).start()
    config = {
        "models": [{"name": "chat", "versions": [{"name": "v1", "weight": 1, "upstreams": [fake.url]}]}],
        "polling": FAST_POLLING,
        "state": {"dir": str(tmp_path / "state"), "redis_url": redis_server.url, "replicas": 3},
        "auth": {"admin_key": ADMIN_KEY, "keys": [
            {"key": RATE_KEY, "name": "rate", "limits": {"requests": 60, "window_s": WINDOW_S}},
            {"key": BUDGET_KEY, "name": "budget", "limits": {"budget": {"tokens": BUDGET, "period": "day"}}},
            {"key": SHARE_KEY, "name": "share", "limits": {"requests": 30, "window_s": 60}},
        ]}}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    group = [Replica(path, tmp_path / f"gateway-{i}.log") for i in range(3)]
    try:
        wait_until(lambda: all(r.ready() for r in group), timeout=60, what="three gateways ready")
        yield group
    finally:
        for r in group:
            r.stop()
        fake.stop(force=True)


def _burst(group: list[Replica], key: str, n: int, **body) -> list[httpx.Response]:
    with ThreadPoolExecutor(12) as pool:
        return list(pool.map(lambda i: group[i % 3].chat(key, **body), range(n)))


def test_a_key_gets_its_limit_through_three_replicas_and_no_more(replicas):
    t0 = time.monotonic()
    answers = _burst(replicas, RATE_KEY, 150)
    elapsed = time.monotonic() - t0
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 429}
    if elapsed < WINDOW_S:  # every admission fell within one window: the cap, exactly (tolerance 0)
        assert codes.count(200) == 60, (codes.count(200), elapsed)
    else:  # a machine too loaded to send 150 in a window: still never over the cap in it
        assert codes.count(200) >= 60
    refused = [a for a in answers if a.status_code == 429]
    assert all(a.json()["error"]["code"] == "rate_limit_exceeded" and int(a.headers["retry-after"]) >= 1
               for a in refused)
    # every replica counted every replica's requests
    assert {r.usage("rate")["limits"]["requests"]["used"] for r in replicas} == {codes.count(200)}
    assert sum(r.usage("rate")["this_replica"]["requests"] for r in replicas) == codes.count(200)


def test_a_budget_is_never_exceeded_by_more_than_one_requests_tokens(replicas):
    answers = _burst(replicas, BUDGET_KEY, 120)
    ok = [a for a in answers if a.status_code == 200]
    spent = sum(a.json()["usage"]["total_tokens"] for a in ok)
    per_request = max(a.json()["usage"]["total_tokens"] for a in ok)
    assert spent <= BUDGET + per_request
    assert spent >= BUDGET // 3  # the reservations' estimates are high, but not absurdly
    quota = [a for a in answers if a.status_code == 429]
    assert quota and all(a.json()["error"]["type"] == "insufficient_quota" for a in quota)
    # settled to the actual usage, as every replica sees it
    wait_until(lambda: replicas[0].usage("budget")["limits"]["budget"]["used"] == spent, timeout=10,
               what="the usage settled")


def test_with_redis_gone_each_replica_enforces_its_share_and_resumes(replicas, redis_server):
    redis_server.stop()
    answers = _burst(replicas, SHARE_KEY, 60)
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 429} and codes.count(200) <= 30  # 3 x 30 // 3: never over the limit
    assert codes.count(200) >= 27
    for r in replicas:
        limits = r.ready()["limits"]
        assert limits["degraded"] and limits["local_share"] == "1/3"
        assert "llmserve:gateway_limits_degraded 1.0" in r.client.get("/metrics").text
        assert r.usage("share")["counted_by"] == "this replica"
    redis_server.start()
    wait_until(lambda: not any(r.ready()["limits"]["degraded"] for r in replicas), timeout=15,
               what="the replicas back on Redis")
    answers = _burst(replicas, SHARE_KEY, 45)
    assert [a.status_code for a in answers].count(200) == 30  # one shared limit again (Redis came back empty)
    assert replicas[1].usage("share")["limits"]["requests"]["used"] == 30


def test_a_replica_that_redis_refuses_does_not_start_and_says_why_in_one_line(redis_server, tmp_path):
    path = tmp_path / "gateway.yaml"
    wrong = redis_server.url.replace(redis_server.password, "not-the-password")
    path.write_text(yaml.safe_dump({
        "models": [{"name": "chat", "versions": [{"name": "v1", "weight": 1, "upstreams": []}]}],
        "state": {"dir": str(tmp_path / "state"), "redis_url": wrong},
        "auth": {"keys": [{"key": RATE_KEY, "name": "rate", "limits": {"requests": 5}}]}}))
    done = subprocess.run([sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(path),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused our credentials" in lines[0]
    assert "not-the-password" not in done.stderr
