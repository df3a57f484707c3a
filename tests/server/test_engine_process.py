"""``llmserve engine`` runs its core in a child process: killing that child fails the instance."""

from __future__ import annotations

import os
import signal
import time

import httpx

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine


def _forked_children(pid: int) -> list[int]:
    """The children forked from ``pid`` (same command line): the engine core, not helpers."""
    def cmdline(p: int) -> bytes:
        with open(f"/proc/{p}/cmdline", "rb") as f:
            return f.read()
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split() if cmdline(int(x)) == cmdline(pid)]


def test_killing_the_engine_process_turns_ready_503_and_ends_the_stream(tmp_path):
    ep = start_engine(make_tiny_llama(tmp_path / "model", max_position_embeddings=4096), tmp_path)
    try:
        assert httpx.get(ep.url + "/ready").status_code == 200
        (child,) = _forked_children(ep.proc.pid)
        body = {"prompt": [5, 6, 7], "max_tokens": 4000, "ignore_eos": True, "temperature": 0, "stream": True}
        # 4,000 tokens: the stream must still be running when the kill lands, even when
        # this client reads its second event late on a loaded machine
        events = []
        with httpx.stream("POST", ep.url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(line)
                    if len(events) == 2:
                        os.kill(child, signal.SIGKILL)
        assert '"engine_dead"' in events[-1]
        deadline = time.monotonic() + 10
        while httpx.get(ep.url + "/ready").status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        ready = httpx.get(ep.url + "/ready")
        assert ready.status_code == 503 and ready.json()["state"] == "failed"
        assert httpx.get(ep.url + "/health").status_code == 503
        assert httpx.post(ep.url + "/v1/completions", json={**body, "stream": False}).status_code == 503
    finally:
        ep.stop()
