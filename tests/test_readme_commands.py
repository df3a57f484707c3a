"""Every command the README shows, run as a user types it, on the real default model.

The commands are read out of the README's shell blocks (a command the README
gains without a case here fails :func:`test_every_readme_command_has_a_case`),
and each runs through ``bash -c`` with the venv's ``bin`` first on ``PATH``, as
after ``source .venv/bin/activate``. The servers listen where the README says
(engine 8001, gateway 8080, serve 8000); the Python snippets run against them
verbatim. ``bash scripts/setup.sh test`` is what CI itself runs, and
``bash scripts/setup.sh`` is that install followed by the ``llmserve serve`` run here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BIN = str(Path(sys.executable).parent)
KINDS = ("pull", "generate", "chat", "engine", "gateway", "serve", "bench", "simulate")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def readme_commands() -> dict[str, str]:
    """``llmserve`` command lines of the README's bash blocks, by subcommand, comments cut."""
    found: dict[str, str] = {}
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("llmserve "):
                found[line.split()[1]] = line
    return found


COMMANDS = readme_commands()


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"}


def run(line: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=_env(), input=stdin, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


class Server:
    """A README server command running in the background, stopped with SIGTERM as a user's Ctrl-C would."""

    def __init__(self, line: str, url: str, log: Path) -> None:
        self.line, self.url, self.log = line, url, log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=ROOT, env=_env(), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, path: str = "/ready", timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.line!r} exited:\n{self.log.read_text()[-4000:]}"
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.line!r} not ready after {timeout}s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def test_every_readme_command_has_a_case():
    assert sorted(COMMANDS) == sorted(KINDS), "a README command without a test here, or one gone"
    assert len(_blocks("python")) == 2, "a README Python snippet without a test here"


def test_pull(smollm2_path):
    out = run(COMMANDS["pull"]).stdout
    assert Path(out.strip().splitlines()[-1]) == smollm2_path


def test_generate():
    assert "Paris" in run(COMMANDS["generate"]).stdout


def test_chat_reads_stdin():
    out = run(COMMANDS["chat"], stdin="What is 2+2?\n").stdout
    assert "4" in out


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    s = Server(COMMANDS["engine"], "http://127.0.0.1:8001", tmp_path_factory.mktemp("engine") / "engine.log")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def test_engine_answers(engine):
    r = httpx.post(engine.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
        "temperature": 0})
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]


def test_bench_against_the_engine(engine):
    out = run(COMMANDS["bench"]).stdout
    asked = int(re.search(r"--num-prompts (\d+)", COMMANDS["bench"]).group(1))
    assert re.search(rf"Successful requests\D+{asked}\b", out), out[-3000:]


def test_gateway_with_the_example_config(engine, tmp_path):
    gw = Server(COMMANDS["gateway"], "http://127.0.0.1:8080", tmp_path / "gateway.log")
    try:
        gw.wait_ready("/health")
        deadline = time.monotonic() + 60
        while True:  # the example's v1 has the README's engine among its upstreams
            r = httpx.post(gw.url + "/v1/chat/completions", timeout=120,
                           headers={"Authorization": "Bearer change-me-client-key-1"},
                           json={"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}],
                                 "max_tokens": 8})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
    finally:
        gw.stop()


def test_serve_with_the_example_config_and_the_python_snippets(tmp_path):
    serve = Server(COMMANDS["serve"], "http://127.0.0.1:8000", tmp_path / "serve.log")
    try:
        serve.wait_ready()
        sdk, engine_api = _blocks("python")
        out = subprocess.run([sys.executable, "-c", sdk], env=_env(), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip(), out.stderr[-3000:]
        out = subprocess.run([sys.executable, "-c", engine_api], env=_env(), capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip().split()[-1] in ("stop", "length"), out.stdout
    finally:
        serve.stop()


def test_simulate(tmp_path):
    out = run(COMMANDS["simulate"], timeout=900).stdout
    for policy in re.search(r"--policy (\S+)", COMMANDS["simulate"]).group(1).split(","):
        # its row of the table: the policy, then its share of requests within the TTFT SLO
        assert re.search(rf"[│|]\s*{policy}\s*[│|]\s*\d+\.\d+%", out), out[-3000:]
