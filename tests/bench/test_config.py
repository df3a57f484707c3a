"""The bench configuration is its command line: every flag of ``vllm bench serve``'s
names lands in its field, the defaults are the models', a bad value is refused once
(exit 2, one line naming the flag), and the saved ``config`` keeps its keys."""

from __future__ import annotations

import argparse
import math

import pytest
from pydantic import ValidationError

from llmserve.bench.cli import add_bench_args, config_from_args, main
from llmserve.bench.client import EndpointConfig
from llmserve.bench.config import BenchConfig, DatasetConfig, LoadConfig
from llmserve.bench.metrics import SLO

# Every flag `llmserve bench` has had, with the choices it takes.
OLD_FLAGS = {
    "--base-url": None, "--model": None, "--endpoint": ("chat", "completions"), "--api-key": None,
    "--ignore-eos": None, "--timeout": None, "--num-prompts": None, "--request-rate": None, "--burstiness": None,
    "--max-concurrency": None, "--rate-trace": None, "--num-warmups": None, "--seed": None,
    "--dataset-name": ("random", "shared-prefix", "multi-turn", "input-grounded", "jsonl", "sharegpt"),
    "--dataset-path": None, "--tokenizer": None, "--random-input-len": None, "--random-output-len": None,
    "--random-range-ratio": None, "--output-len": None, "--num-prefixes": None, "--prefix-len": None,
    "--question-len": None, "--turns": None, "--turn-user-len": None, "--grounded-input-len": None,
    "--grounded-task": ("rewrite", "summarize"), "--batch-share": None, "--goodput": None,
    "--metric-percentiles": None, "--save-result": None, "--plot": None, "--server-metrics": None,
    "--label": None, "--disable-tqdm": None,
}

EVERY_FLAG = ["--base-url", "http://h:9/v1", "--model", "m", "--endpoint", "chat", "--api-key", "k",
              "--ignore-eos", "--timeout", "30", "--num-prompts", "7", "--request-rate", "2.5",
              "--burstiness", "0.5", "--max-concurrency", "3", "--rate-trace", "t.csv", "--num-warmups", "2",
              "--seed", "5", "--dataset-name", "input-grounded", "--dataset-path", "src.txt", "--tokenizer", "tok",
              "--random-input-len", "11", "--random-output-len", "12", "--random-range-ratio", "0.25",
              "--output-len", "13", "--num-prefixes", "14", "--prefix-len", "15", "--question-len", "16",
              "--turns", "17", "--turn-user-len", "18", "--grounded-input-len", "19", "--grounded-task",
              "summarize", "--batch-share", "0.3", "--goodput", "ttft:500", "tpot:50",
              "--metric-percentiles", "50,99.9", "--save-result", "out/r.json", "--plot", "--server-metrics",
              "--label", "L", "--disable-tqdm"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmserve bench")
    add_bench_args(p)
    return p


def config(argv: list[str]) -> BenchConfig:
    return config_from_args(parser().parse_args(argv))


def test_every_old_flag_is_there_with_its_choices():
    actions = {s: a for a in parser()._actions for s in a.option_strings}
    for flag, choices in OLD_FLAGS.items():
        assert flag in actions, flag
        assert (tuple(actions[flag].choices) if actions[flag].choices else None) == choices, flag


def test_every_flag_lands_where_the_hand_mapping_put_it():
    cfg = config(EVERY_FLAG)
    assert cfg.endpoint.api_key == "k"  # sent, never saved
    assert cfg.to_dict() == {
        "endpoint": {"base_url": "http://h:9/v1", "model": "m", "endpoint": "chat", "ignore_eos": True,
                     "timeout_s": 30.0, "ready_check_timeout_s": 600.0, "temperature": 0.0, "top_p": None, "top_k": None,
                     "min_p": None, "extra_body": {},
                     "url": "http://h:9/v1/chat/completions"},
        "dataset": {"name": "input-grounded", "path": "src.txt", "tokenizer": "tok", "output_len": 13,
                    "random_input_len": 11, "random_output_len": 12, "random_range_ratio": 0.25,
                    "num_prefixes": 14, "prefix_len": 15, "question_len": 16, "turns": 17, "turn_user_len": 18,
                    "grounded_input_len": 19, "grounded_task": "summarize", "sharegpt_output_len": None,
                    "batch_share": 0.3},
        "load": {"num_prompts": 7, "request_rate": 2.5, "burstiness": 0.5, "max_concurrency": 3,
                 "rate_trace": "t.csv", "num_warmups": 2, "seed": 5},
        "percentiles": (50.0, 99.9), "percentile_metrics": ("ttft", "tpot", "itl", "e2el"),
        "slo": {"ttft": 500.0, "tpot": 50.0}, "save_result": "out/r.json",
        "plot": "out/r.png", "show_progress": False, "label": "L", "server_metrics": ""}


def test_no_flags_give_the_old_defaults():
    cfg = config(["--model", "m"])
    assert cfg == BenchConfig(endpoint=EndpointConfig(model="m"))
    e, d, lo = cfg.endpoint, cfg.dataset, cfg.load
    assert (e.base_url, e.endpoint, e.api_key, e.ignore_eos, e.timeout_s) == (
        "http://127.0.0.1:8000/v1", "completions", None, False, 600.0)
    assert (lo.num_prompts, lo.burstiness, lo.max_concurrency, lo.rate_trace, lo.num_warmups, lo.seed) == (
        1000, 1.0, None, None, 0, 0) and math.isinf(lo.request_rate)
    assert (d.name, d.path, d.tokenizer, d.output_len, d.random_input_len, d.random_output_len,
            d.random_range_ratio, d.num_prefixes, d.prefix_len, d.question_len, d.turns, d.turn_user_len,
            d.grounded_input_len, d.grounded_task, d.batch_share) == (
        "random", None, None, 128, 1024, 128, 0.0, 10, 512, 32, 4, 64, 512, "rewrite", 0.0)
    assert (cfg.percentiles, cfg.slo, cfg.save_result, cfg.plot, cfg.show_progress, cfg.label,
            cfg.server_metrics) == ((90.0, 99.0), SLO(), None, None, True, None, None)
    assert config(["--model", "m", "--plot"]).plot == "bench.png"  # no --save-result to sit beside
    assert config(["--model", "m", "--plot", "p.png", "--server-metrics", "http://x/metrics"]).plot == "p.png"


def test_the_saved_config_keeps_its_keys_and_leaves_the_key_out():
    d = config(["--model", "m", "--api-key", "secret"]).to_dict()
    assert list(d) == ["endpoint", "dataset", "load", "percentiles", "percentile_metrics", "slo", "save_result",
                       "plot", "show_progress", "label", "server_metrics"]
    assert list(d["endpoint"]) == ["base_url", "model", "endpoint", "ignore_eos", "timeout_s",
                                   "ready_check_timeout_s", "temperature", "top_p", "top_k", "min_p", "extra_body",
                                   "url"]
    assert list(d["load"]) == ["num_prompts", "request_rate", "burstiness", "max_concurrency", "rate_trace",
                               "num_warmups", "seed"]
    assert d["load"]["request_rate"] == "inf" and "secret" not in repr(d)


@pytest.mark.parametrize("argv, why", [
    (["--num-prompts", "0"], "--num-prompts: Input should be greater than or equal to 1, got 0"),
    (["--random-range-ratio", "1"], "--random-range-ratio: Input should be less than 1, got 1.0"),
    (["--dataset-name", "jsonl"], "the jsonl dataset needs --dataset-path"),
    (["--request-rate", "0"], "--request-rate: Input should be greater than 0"),
    (["--metric-percentiles", "50,101"], "--metric-percentiles: Input should be less than or equal to 100"),
    (["--metric-percentiles", "p99"], "--metric-percentiles 'p99': expected comma-separated numbers"),
    (["--base-url", "ftp://h/v1"], "--base-url: base URL must be http(s)://host:port[/path]"),
    (["--goodput", "ttft:x"], "--goodput: goodput SLO 'ttft:x'"),
])
def test_a_bad_value_exits_2_with_one_line_naming_it(argv, why, capsys):
    assert main(["--model", "m", "--disable-tqdm", *argv]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"llmserve bench: {why}") and "\n" not in out


def test_the_models_refuse_what_the_flags_would():
    for bad in (dict(num_prompts=0), dict(burstiness=0), dict(max_concurrency=0), dict(num_warmups=-1)):
        with pytest.raises(ValidationError):
            LoadConfig(**bad)
    for bad in (dict(turns=0), dict(prefix_len=-1), dict(batch_share=1.5), dict(grounded_task="poem"),
                dict(name="csv")):
        with pytest.raises(ValidationError):
            DatasetConfig(**bad)
    with pytest.raises(ValidationError):
        EndpointConfig(model="m", timeout_s=0)
    with pytest.raises(ValidationError):
        BenchConfig(endpoint=EndpointConfig(model="m"), percentiles=(0.0,))
    with pytest.raises(ValidationError):  # frozen: validated once
        LoadConfig().seed = 3  # type: ignore[misc]
