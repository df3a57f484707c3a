"""The console script: every layer is reachable, and only the chosen one is imported."""

from __future__ import annotations

import subprocess
import sys

LAYERS = ("llmserve.bench.cli", "llmserve.sim.cli", "llmserve.gateway.cli", "llmserve.serve.serve")


def _imported_after(argv: list[str]) -> set[str]:
    code = ("import sys; from llmserve.cli import build_parser; "
            f"build_parser({argv!r}).parse_args({argv!r}); "
            f"print(','.join(m for m in {LAYERS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(filter(None, out.strip().split(",")))


def test_engine_start_imports_no_other_layer():
    assert _imported_after(["engine", "--model", "x"]) == set()


def test_a_layer_command_imports_only_its_own_module():
    assert _imported_after(["simulate", "--no-plots"]) == {"llmserve.sim.cli"}


def test_help_lists_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "llmserve.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for name in ("pull", "generate", "chat", "engine", "calibrate", "bench", "simulate", "gateway", "serve"):
        assert name in out


def test_chat_goes_on_when_a_turn_outgrows_the_context(tmp_path):
    """A message the context cannot take is refused alone: the session (and its history)
    goes on, as a llama.cpp user would expect, instead of ending with the error."""
    from tests.helpers import make_tiny_llama

    model = make_tiny_llama(tmp_path)
    turns = "hello\n" + "word " * 200 + "\nthird\n"
    proc = subprocess.run([sys.executable, "-m", "llmserve.cli", "chat", "--model", str(model), "--max-model-len", "96",
                           "--max-tokens", "4", "--dtype", "fp32"], input=turns, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "was not sent" in proc.stderr and proc.stdout.count("\n") >= 2  # turns 1 and 3 answered


def test_generate_reads_a_dash_prompt_from_stdin(tmp_path):
    from tests.helpers import make_tiny_llama

    model = make_tiny_llama(tmp_path)
    base = [sys.executable, "-m", "llmserve.cli", "generate", "--model", str(model), "--max-tokens", "4",
            "--temperature", "0", "--dtype", "fp32"]
    piped = subprocess.run(base + ["-"], input="hello there", capture_output=True, text=True, timeout=300)
    given = subprocess.run(base + ["hello there"], capture_output=True, text=True, timeout=300)
    assert piped.returncode == given.returncode == 0, piped.stderr[-2000:]
    assert piped.stdout == given.stdout and piped.stdout.strip()
    refused = subprocess.run(base + ["hi", "--system", "be brief"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--system needs --chat" in refused.stderr


def test_generate_and_chat_refuse_bad_flags_before_loading_the_model(tmp_path):
    # A model that is not there: a flag error must come first (the model would take seconds to load).
    missing = str(tmp_path / "no-such-model.gguf")
    for cmd, extra, why in (("generate", ["hi", "--max-tokens", "0"], "max_tokens must be at least 1"),
                            ("chat", ["--temperature", "-1"], "temperature must be in"),
                            ("generate", ["hi", "--system", "be brief"], "--system needs --chat")):
        proc = subprocess.run([sys.executable, "-m", "llmserve.cli", cmd, "--model", missing, *extra],
                              input="", capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and why in proc.stderr, (cmd, proc.stderr[-2000:])
        assert "no-such-model" not in proc.stderr
