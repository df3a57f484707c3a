"""Instances forked from the pre-imported template process (the local provider's default).

Real processes throughout: the template imports torch and the server, forks a
real ``llmserve engine`` on a tiny model, and the checks are what a controller
relies on: the instance is the template's child (so it skipped the imports),
serves, drains to exit code 0 on stop, and reports exit codes; bad protocol
messages are refused without killing the template; a spec with an environment
variable torch reads at import is spawned fresh instead; closing the template
stops what it forked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from llmserve.autoscale.providers.base import InstanceSpec, RunState
from llmserve.autoscale.providers.local import LocalProvider, LocalProviderConfig
from llmserve.ports import free_port
from llmserve.server.fork_server import ForkedProcess, Template, TemplateError
from tests.helpers import make_tiny_llama


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def _wait_ready(url: str, provider: LocalProvider, handle, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(url + "/ready", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if (await provider.status(handle)).gone:
                raise AssertionError(await provider.log_tail(handle, 40))
            await asyncio.sleep(0.05)
    raise AssertionError("not ready in time:\n" + await provider.log_tail(handle, 40))


async def test_a_forked_instance_serves_drains_and_exits_0(tmp_path):
    model = make_tiny_llama(tmp_path)
    provider = LocalProvider(LocalProviderConfig(log_dir=str(tmp_path / "logs")))
    try:
        handle = await provider.start(InstanceSpec("a", ("--model", str(model), "--threads", "1")))
        proc = provider._procs["a"]
        assert isinstance(proc, ForkedProcess)
        assert provider.template is not None and _ppid(proc.pid) == provider.template.proc.pid
        await _wait_ready(handle.url, provider, handle)
        async with httpx.AsyncClient() as c:
            name = (await c.get(handle.url + "/v1/models")).json()["data"][0]["id"]
            r = await c.post(handle.url + "/v1/completions",
                             json={"model": name, "prompt": "hello", "max_tokens": 5, "ignore_eos": True})
            # the instance's HTTP limits hold when forked too (issue 17: a 40 KB header got 200)
            big = await c.get(handle.url + "/health", headers={"x-big": "a" * 40_000})
            # SIGPIPE ignored, as in a fresh Python: a write to a client that left must not kill it
            os.kill(proc.pid, signal.SIGPIPE)
            assert (await c.get(handle.url + "/health")).status_code == 200
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
        assert big.status_code == 431, big.text
        assert (await provider.status(handle)).state is RunState.RUNNING
        assert await provider.stop(handle, grace_s=30) == 0  # SIGTERM drained it
    finally:
        await provider.close()
    assert provider.template is not None and provider.template.proc.returncode == 0


async def test_an_import_time_variable_gets_a_fresh_process(tmp_path):
    provider = LocalProvider(LocalProviderConfig(log_dir=str(tmp_path / "logs")))
    try:
        handle = await provider.start(InstanceSpec("b", ("--model", str(tmp_path / "none")),
                                                   env=(("OMP_NUM_THREADS", "1"),)))
        assert isinstance(provider._procs["b"], subprocess.Popen)
        # no such model: a clear error, in one line and exit code 2 (the CLI's for a bad model)
        assert await asyncio.to_thread(provider._procs["b"].wait, 60) == 2
        assert "llmserve: error: unknown model" in await provider.log_tail(handle)
        # and the status the controller logs says why, not just the code
        status = await provider.status(handle)
        assert status.exit_code == 2 and "llmserve: error: unknown model" in status.detail, status
    finally:
        await provider.close()


def test_the_template_reports_exit_codes_and_refuses_bad_messages(tmp_path):
    t = Template(tmp_path / "template.log")
    try:
        assert t.wait_ready(120), t.error
        assert t.preload_s is not None and t.preload_s > 0
        child = t.spawn(["--model", str(tmp_path / "missing")], tmp_path / "child.log")
        assert child.wait(60) == 2
        assert "llmserve: error: unknown model" in (tmp_path / "child.log").read_text()
        with pytest.raises(TemplateError):
            t._call({"op": "spawn", "argv": "engine --model x", "log": str(tmp_path / "x.log")})
        with pytest.raises(TemplateError):
            t._call({"op": "rm -rf"})
        assert t.signal(os.getpid(), 15) is False  # not its child: never signalled
        assert t.signal(child.pid, 15) is False  # reaped already
        assert t.usable
    finally:
        t.close()


def test_closing_the_template_stops_its_children(tmp_path):
    model = make_tiny_llama(tmp_path)
    t = Template(tmp_path / "template.log")
    assert t.wait_ready(120), t.error
    child = t.spawn(["--model", str(model), "--threads", "1", "--port", str(free_port())], tmp_path / "child.log")
    time.sleep(0.5)
    assert child.poll() is None
    t.close()
    assert t.proc.returncode == 0
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child.pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child.pid}") or "Z" in Path(f"/proc/{child.pid}/stat").read_text().split()[2]
