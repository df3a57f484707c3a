"""``llmserve serve`` and ``llmserve gateway`` on a port that is taken refuse at start, in one
line with exit 2 (as ``llmserve engine`` does): not the banner, instances started, then
uvicorn's bind error and exit 3."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from llmserve.ports import listen


@pytest.fixture
def taken():
    sock = listen("127.0.0.1", 0)
    yield sock.getsockname()[1]
    sock.close()


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmserve.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _refused(out: subprocess.CompletedProcess, said: str) -> None:
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert lines == [f"llmserve: error: {said}"], out.stderr
    assert "pool" not in out.stdout  # nothing was started: serve's banner never printed


def test_serve_on_a_taken_port(tmp_path, taken, smollm2_path):
    out = _run("serve", "--port", str(taken), "--model", str(smollm2_path), cwd=tmp_path)
    _refused(out, f"cannot listen on 127.0.0.1:{taken}: address already in use")


def test_gateway_on_a_taken_port_or_a_host_that_does_not_resolve(tmp_path, taken):
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("models:\n  - name: m\n    versions:\n      - {name: v1, weight: 1, upstreams: []}\n")
    out = _run("gateway", "--config", str(cfg), "--port", str(taken), cwd=tmp_path)
    _refused(out, f"cannot listen on 127.0.0.1:{taken}: address already in use")
    with pytest.raises(OSError):
        socket.getaddrinfo("no-such-host.invalid", 80)
    out = _run("gateway", "--config", str(cfg), "--host", "no-such-host.invalid", "--port", str(taken), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith(f"llmserve: error: cannot listen on no-such-host.invalid:{taken}: ")
