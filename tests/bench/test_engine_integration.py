"""``llmserve bench`` against a real ``llmserve engine`` process (tiny random Llama).

The bench's counts must equal the server's own: requests and tokens from the
usage field against the deltas of ``vllm:request_success``, ``vllm:prompt_tokens``
and ``vllm:generation_tokens`` over the run, and with the model's tokenizer the
dataset's prompt lengths must equal the server's usage on /v1/completions.
"""

from __future__ import annotations

import json

import pytest

from llmserve.bench.cli import main
from llmserve.bench.report import load_result
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=256)


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    ep = start_engine(tiny_model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny")
    yield ep
    ep.stop()


def bench(engine, tiny_model, out, *extra: str) -> dict:
    code = main(["--base-url", engine.url + "/v1", "--model", "tiny", "--tokenizer", str(tiny_model),
                 "--server-metrics", "--disable-tqdm", "--save-result", str(out), *extra])
    data = load_result(out)
    data["exit_code"] = code
    return data


@pytest.mark.parametrize("endpoint, seed", [("completions", "1"), ("chat", "2")])
def test_counts_equal_the_servers_metrics(engine, tiny_model, tmp_path, endpoint, seed):
    # Its own seed: prompts of another test already in the prefix cache would lower
    # the server's prompt-token counter (it counts computed tokens).
    data = bench(engine, tiny_model, tmp_path / "r.json", "--endpoint", endpoint, "--seed", seed, "--num-prompts", "12",
                 "--random-input-len", "24", "--random-output-len", "8", "--random-range-ratio", "0.5",
                 "--ignore-eos", "--max-concurrency", "4", "--num-warmups", "2", "--batch-share", "0.25")
    s, deltas = data["summary"], data["meta"]["server_metrics"]["deltas"]
    assert data["exit_code"] == 0
    assert (s["completed"], s["failed"]) == (12, 0)
    assert deltas["request_success"] == 12  # warm-ups excluded on both sides
    assert s["total_output_tokens"] == deltas["generation_tokens"] == sum(r["max_tokens"] for r in data["requests"])
    assert s["server_prompt_tokens"] == deltas["prompt_tokens"]
    assert all(r["output_source"] == "usage" for r in data["requests"])
    assert s["max_in_flight"] <= 4
    if endpoint == "completions":
        # exact dataset counts: what the bench generated is what the server tokenized
        assert [r["prompt_len"] for r in data["requests"]] == [r["usage_prompt_tokens"] for r in data["requests"]]
        assert s["total_input_tokens"] == s["server_prompt_tokens"]
    else:  # the chat template adds tokens the dataset does not count
        assert s["server_prompt_tokens"] > s["total_input_tokens"]
    assert sorted(data["per_class"]) == ["batch", "realtime"] and data["per_class"]["batch"]["completed"] == 3


def test_multi_turn_and_shared_prefix_run_clean(engine, tiny_model, tmp_path):
    for name, extra in (("multi-turn", ["--turns", "3", "--turn-user-len", "8"]),
                        ("shared-prefix", ["--num-prefixes", "2", "--prefix-len", "32", "--question-len", "4"])):
        data = bench(engine, tiny_model, tmp_path / f"{name}.json", "--dataset-name", name, "--num-prompts", "6",
                     "--output-len", "4", "--ignore-eos", "--request-rate", "20", *extra)
        s, deltas = data["summary"], data["meta"]["server_metrics"]["deltas"]
        assert (s["completed"], s["failed"]) == (6, 0), name
        assert s["total_output_tokens"] == deltas["generation_tokens"] == 24, name


def test_server_rejections_are_failures_by_status(engine, tiny_model, tmp_path):
    prompts = tmp_path / "p.jsonl"
    long_prompt = " ".join(["hello world"] * 400)  # beyond the 256-token context
    prompts.write_text(json.dumps({"prompt": "hello", "output_len": 3}) + "\n" + json.dumps({"prompt": long_prompt}) + "\n")
    data = bench(engine, tiny_model, tmp_path / "f.json", "--dataset-name", "jsonl", "--dataset-path", str(prompts),
                 "--num-prompts", "4", "--output-len", "3")
    s = data["summary"]
    assert (s["completed"], s["failed"]) == (2, 2)
    assert list(s["failures_by_kind"]) == ["http_400"] and s["failures_by_kind"]["http_400"] == 2
    assert data["meta"]["server_metrics"]["deltas"]["request_success"] == 2
