"""Cross-checking the bench's counts with the server's /metrics counters."""

from __future__ import annotations

import pytest

from llmserve.bench.cli import main
from llmserve.bench.report import load_result
from llmserve.bench.server_metrics import counter_deltas, default_metrics_url, read_counters

TEXT = """# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="a"} 100.0
vllm:prompt_tokens_total{model_name="b"} 20.0
vllm:prompt_tokens_created{model_name="a"} 1.7e9
vllm:generation_tokens_total{model_name="a"} 7
vllm:request_success_total{finished_reason="stop"} 3
vllm:request_success_total{finished_reason="length"} 2
vllm:num_requests_running 4
"""


def test_read_counters_sums_label_sets_and_ignores_the_rest():
    assert read_counters(TEXT) == {"prompt_tokens": 120.0, "generation_tokens": 7.0, "request_success": 5.0}
    assert read_counters("vllm:prompt_tokens 5\n") == {"prompt_tokens": 5.0}
    assert read_counters("other 1\n") == {}


def test_a_gateways_own_counters_are_read_where_there_are_no_vllm_ones():
    gateway = ('llmserve:gateway_requests_total{model="m",version="v1",priority="realtime",status="200"} 4\n'
               'llmserve:gateway_requests_total{model="m",version="v1",priority="realtime",status="429"} 9\n'
               'llmserve:gateway_prompt_tokens_total{model="m",version="v1"} 40\n'
               'llmserve:gateway_generation_tokens_total{model="m",version="v1"} 12\n')
    assert read_counters(gateway) == {"request_success": 4.0, "prompt_tokens": 40.0, "generation_tokens": 12.0}


def test_deltas_and_urls():
    assert counter_deltas({"prompt_tokens": 5.0}, {"prompt_tokens": 9.0}) == {"prompt_tokens": 4.0}
    assert counter_deltas(None, {"prompt_tokens": 9.0}) == {}
    assert default_metrics_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    assert default_metrics_url("http://127.0.0.1:8000/x/v1/") == "http://127.0.0.1:8000/x/metrics"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_counts_equal_the_servers_counter_deltas(fake_server, tmp_path, capsys, endpoint):
    out = tmp_path / "r.json"
    argv = ["--base-url", fake_server.url("/ok/v1"), "--num-prompts", "9", "--num-warmups", "3",
            "--dataset-name", "shared-prefix", "--num-prefixes", "2", "--prefix-len", "12",
            "--question-len", "4", "--output-len", "5", "--ignore-eos", "--endpoint", endpoint,
            "--server-metrics", "--disable-tqdm", "--save-result", str(out)]
    assert main(argv) == 0
    data = load_result(out)
    deltas = data["meta"]["server_metrics"]["deltas"]
    s = data["summary"]
    assert deltas == {"request_success": 9.0, "prompt_tokens": 9.0 * 16, "generation_tokens": 45.0}
    assert s["completed"] == deltas["request_success"]
    assert s["total_output_tokens"] == deltas["generation_tokens"]
    assert s["server_prompt_tokens"] == deltas["prompt_tokens"] == s["total_input_tokens"]
    assert "Server counters over the run" in capsys.readouterr().out


def test_missing_metrics_is_reported_not_fatal(fake_server, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--base-url", fake_server.url("/ok/v1"), "--num-prompts", "2", "--random-input-len", "4",
                 "--server-metrics", "http://127.0.0.1:9/metrics", "--disable-tqdm",
                 "--save-result", str(out)]) == 0
    assert load_result(out)["meta"]["server_metrics"]["deltas"] == {}
    assert "No server counters" in capsys.readouterr().out
