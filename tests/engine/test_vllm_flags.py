"""``llmserve engine`` takes the ``vllm serve`` flags a copied command line carries where it
behaves the same (they were 'unrecognized arguments', exit 2), and refuses by name the
values it does not implement."""

from __future__ import annotations

import pytest

from llmserve.cli import build_parser
from llmserve.flags import given
from llmserve.server.config import ServerConfig


def _parse(*flags: str):
    return build_parser(["engine"]).parse_args(["engine", *flags])


def test_vllm_serve_flags_are_taken():
    args = _parse("--disable-log-requests", "--uvicorn-log-level", "info", "--generation-config", "vllm",
                  "--tensor-parallel-size", "1", "--trust-remote-code", "--enforce-eager",
                  "--served-model-name", "a", "b", "--max-model-len", "512", "--seed", "3",
                  "--max-num-batched-tokens", "256", "--enable-prefix-caching")
    assert given(ServerConfig, args)["log_level"] == "info"
    assert given(ServerConfig, args)["served_model_name"] == ["a", "b"]
    assert "log_level" not in given(ServerConfig, _parse())  # (the alias sets no default of its own)


@pytest.mark.parametrize("flags,says", [
    (("--uvicorn-log-level", "loud"), "uvicorn-log-level"),
    (("-tp", "2"), "one device"),
    (("--gpu-memory-utilization", "0.9"), "--kv-cache-memory"),
])
def test_what_is_not_implemented_is_refused_by_name(flags, says, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(*flags)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_vllm_tool_calling_command_line_is_taken():
    """vLLM's documented tool-calling flags were 'unrecognized arguments' (auto tool choice is always on)."""
    args = _parse("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    assert given(ServerConfig, args)["tool_call_parser"] == "hermes"


def test_dtype_flags_take_vllms_names():
    """``--dtype bfloat16`` was an invalid choice though ``LLM(dtype="bfloat16")`` took it."""
    from llmserve.engine.argv import engine_config_from

    cfg = engine_config_from(_parse("--dtype", "bfloat16", "--kv-cache-dtype", "half", "--lora-dtype", "float32"))
    assert (cfg.dtype, cfg.kv_cache_dtype, cfg.lora_dtype) == ("bf16", "fp16", "fp32")
    assert engine_config_from(_parse("--dtype", "float")).dtype == "fp32"
    with pytest.raises(SystemExit):
        _parse("--dtype", "half")  # (no fp16 weights)
