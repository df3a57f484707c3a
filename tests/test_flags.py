"""The command line is generated from the config models: every field a flag, every
default the model's own, every flag landing in its field in the field's units."""

from __future__ import annotations

import argparse
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmserve.cli import build_parser, engine_config_from
from llmserve.engine.config import EngineConfig
from llmserve.flags import Flag, add_flags, config_from, flag_error, flag_name, given
from llmserve.priority import PriorityRange
from llmserve.server.config import ServerConfig


def _engine_args(*argv: str) -> argparse.Namespace:
    return build_parser(["engine"]).parse_args(["engine", *argv])


def test_no_flags_give_the_models_defaults(monkeypatch):
    monkeypatch.delenv("LLMSERVE_MODEL_STORE", raising=False)
    args = _engine_args()
    assert engine_config_from(args) == EngineConfig()
    assert config_from(ServerConfig, args) == ServerConfig()


@pytest.mark.parametrize("model", [EngineConfig, ServerConfig])
def test_every_field_is_a_flag_unless_marked(model):
    p = argparse.ArgumentParser()
    add_flags(p, model)
    dests = {a.dest for a in p._actions}
    for name, info in model.model_fields.items():
        skip = any(isinstance(m, Flag) and m.skip for m in info.metadata)
        assert (name in dests) != skip, name


def test_flags_land_in_their_fields_in_the_fields_units():
    args = _engine_args("--max-num-seqs", "7", "--kv-cache-memory", "1048576", "--no-enable-prefix-caching",
                        "--step-time-budget-ms", "25", "--speculative-config", '{"num_speculative_tokens": 3}',
                        "--dtype", "fp32", "--drain-timeout", "4", "--no-warmup", "--engine-in-thread",
                        "--api-key", "a", "--api-key", "b", "--priority-range", "-3", "5",
                        "--served-model-name", "x", "y", "--header-timeout", "2.5")
    e = engine_config_from(args)
    assert (e.max_num_seqs, e.kv_cache_memory_bytes, e.enable_prefix_caching, e.dtype) == (7, 1 << 20, False, "fp32")
    assert e.step_time_budget_s == pytest.approx(0.025)
    assert e.speculative_config.num_speculative_tokens == 3 and e.served_model_name == "x"
    s = config_from(ServerConfig, args)
    assert (s.drain_timeout_s, s.warmup, s.engine_process, s.header_timeout_s) == (4.0, False, False, 2.5)
    assert s.api_keys == ["a", "b"] and s.priority_range == PriorityRange(-3, 5) and s.served_model_name == ["x", "y"]


def test_invalid_values_are_refused_once_by_the_model():
    with pytest.raises(ValueError):
        engine_config_from(_engine_args("--max-num-seqs", "0"))
    with pytest.raises(ValueError):
        config_from(ServerConfig, _engine_args("--fault-error-rate", "1.5"))


def test_configs_are_frozen():
    with pytest.raises(ValueError):
        EngineConfig().max_num_seqs = 3  # type: ignore[misc]


def test_flag_names_follow_the_fields():
    assert flag_name("drain_timeout_s", Flag()) == "--drain-timeout"
    assert flag_name("max_num_seqs", Flag()) == "--max-num-seqs"
    assert flag_name("kv_cache_memory_bytes", Flag(name="--kv-cache-memory")) == "--kv-cache-memory"


def test_a_section_is_no_flag_and_a_literal_field_takes_only_its_values():
    from llmserve.autoscale.config import AutoscaleConfig

    p = argparse.ArgumentParser()
    add_flags(p, AutoscaleConfig)
    assert {a.dest for a in p._actions} - {"help"} == {"policy", "tick_s"}  # slo, bounds...: their own flags
    assert given(AutoscaleConfig, p.parse_args(["--policy", "kpa", "--tick", "0.5"])) == {"policy": "kpa",
                                                                                        "tick_s": 0.5}
    with pytest.raises(SystemExit):
        p.parse_args(["--policy", "magic"])


def test_a_skipped_field_is_never_read_from_the_namespace():
    from llmserve.autoscale.config import AutoscaleConfig
    from llmserve.sim.simulator import SimConfig

    ns = argparse.Namespace(policy="kpa,static", initial_instances=None, seed=3)
    assert given(AutoscaleConfig, ns, skip=frozenset({"policy"})) == {}
    assert given(SimConfig, ns) == {"seed": 3}  # initial_instances is Flag(skip=True): set per run


def test_the_help_shows_the_defaults_the_caller_applies():
    from llmserve.autoscale.config import BoundsConfig

    p = argparse.ArgumentParser()
    add_flags(p, BoundsConfig, defaults={"max_instances": 4})
    assert "at most (default: 4)" in " ".join(p.format_help().split())
    assert given(BoundsConfig, p.parse_args([])) == {}  # and passes nothing it was not given


class _Run(BaseModel):
    name: str = Field(description="what to send")  # required: no default to show
    plot: Annotated[str | None, Flag(nargs="?", const="", metavar="PNG")] = None
    rates: Annotated[tuple[float, ...], Flag(name="--rates", type=str, show=lambda r: ",".join(map(str, r)),
                                             parse=lambda s: tuple(float(x) for x in s.split(",")))] = (1.0, 2.0)
    count: int = Field(1, ge=1)


def test_an_optional_value_a_required_field_and_a_default_in_the_flags_syntax():
    p = argparse.ArgumentParser()
    add_flags(p, _Run)
    assert given(_Run, p.parse_args(["--plot"])) == {"plot": ""}  # the bare flag: its const
    assert given(_Run, p.parse_args(["--plot", "a.png"])) == {"plot": "a.png"}
    assert given(_Run, p.parse_args([])) == {}
    assert config_from(_Run, p.parse_args(["--rates", "3,4.5"]), name="m").rates == (3.0, 4.5)
    text = " ".join(p.format_help().split())
    assert "--name NAME what to send --plot [PNG] --rates RATES (default: 1.0,2.0)" in text


def test_a_validation_error_is_one_line_naming_each_flag():
    p = argparse.ArgumentParser()
    add_flags(p, _Run)
    with pytest.raises(ValidationError) as e:
        config_from(_Run, p.parse_args(["--count", "0"]), name="m", rates="x")
    why = flag_error(e.value, _Run)
    assert why == "--rates: Input should be a valid tuple, got 'x'; --count: Input should be greater than or equal to 1, got 0"


def test_another_models_refusal_names_its_keys_not_these_flags():
    """A config file's key that shares a flag's name (``port``) is named as the file has it."""

    class _File(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: str

    with pytest.raises(ValidationError) as e:
        _File(name="x", count=0)
    assert flag_error(e.value, _Run) == "count: Extra inputs are not permitted, got 0"


def test_a_missing_field_is_required_without_its_parents_values():
    """Its input is the whole parent mapping, defaults the user never wrote and all (a
    serve config's ``models: [{name: chat}]`` gave a 594-character line)."""

    class _Inner(BaseModel):
        name: str
        versions: list[str]
        pool: dict = {"admission": {"realtime": {"max_queue": 512}}}

    class _File(BaseModel):
        models: list[_Inner]

    with pytest.raises(ValidationError) as e:
        _File(models=[{"name": "chat"}])
    assert flag_error(e.value, _Run) == "models.0.versions: is required"


def test_byte_sizes_as_people_write_them():
    from llmserve.flags import byte_size

    assert byte_size("1000000") == 1_000_000 and byte_size("2G") == 2 * 10**9 and byte_size("512MiB") == 512 * 2**20
    assert byte_size("1.5GB") == 1_500_000_000 and byte_size("64k") == 64_000
    for bad in ("1X", "G", "lots"):
        with pytest.raises(ValueError, match="is not a size"):
            byte_size(bad)


def test_the_kv_cache_memory_flag_takes_a_size():
    from llmserve.engine.argv import add_engine_args, engine_config_from

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_config_from(p.parse_args(["--kv-cache-memory", "256M"])).kv_cache_memory_bytes == 256 * 10**6
