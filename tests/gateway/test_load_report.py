import math

import pytest
from pydantic import ValidationError

from llmserve.lifecycle import InstanceState
from llmserve.load_report import LoadReport, MetricsLoadParser, parse_prometheus_text

DOC_EXAMPLE = {
    "instance_id": "engine-8001", "model": "smollm2", "ready": True, "draining": False, "state": "ready",
    "num_running": 3, "num_waiting": 2, "num_waiting_by_priority": {"0": 1, "1": 1},
    "kv_cache_usage": 0.42, "busy_fraction": 0.9, "tokens_per_s": 1500.0,
    "generation_tokens_per_s": 600.0, "max_num_seqs": 64, "prefix_cache_hit_rate": 0.3,
    "timestamp": 1700000000.5,
    "step_costs": {"base_s": 0.008, "prefill_token_s": 0.0011, "decode_seq_s": 0.003}, "threads": 2,
    "lora_adapters": ["sql"], "lora_adapters_loaded": ["chat"], "lora_adapters_registered": ["chat", "sql", "web"],
}


def test_load_report_round_trips_the_documented_fields():
    r = LoadReport.model_validate(DOC_EXAMPLE)
    assert r.model_dump() == DOC_EXAMPLE
    assert set(LoadReport.model_fields) == set(DOC_EXAMPLE)


@pytest.mark.parametrize("word,state", [("draining", InstanceState.DRAINING), ("loading", InstanceState.STARTING),
                                        ("booting", None), (None, None)])
def test_the_state_is_read_into_the_lifecycle_enum_and_an_unknown_word_costs_nothing(word, state):
    r = LoadReport.model_validate({**DOC_EXAMPLE, "state": word})
    assert r.state is state and r.num_running == 3


def test_a_report_without_a_state_is_an_older_engines_and_still_valid():
    data = dict(DOC_EXAMPLE)
    del data["state"]
    assert LoadReport.model_validate(data).state is None
    assert '"state":"ready"' in LoadReport.model_validate(DOC_EXAMPLE).model_dump_json()


@pytest.mark.parametrize("field,value", [("kv_cache_usage", 1.5), ("busy_fraction", -0.1),
                                         ("num_running", -1), ("prefix_cache_hit_rate", 2.0)])
def test_load_report_rejects_out_of_range(field, value):
    with pytest.raises(ValidationError):
        LoadReport.model_validate({**DOC_EXAMPLE, field: value})


def test_load_report_requires_every_field():
    data = dict(DOC_EXAMPLE)
    del data["max_num_seqs"]
    with pytest.raises(ValidationError):
        LoadReport.model_validate(data)


def test_parse_prometheus_text_handles_labels_comments_and_specials():
    text = '\n'.join([
        "# HELP vllm:num_requests_running Number of requests",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="my model, v\\"2\\""} 3.0',
        "plain_metric 7 1700000000000",
        'weird{a="}"} NaN',
        "broken{a=1} 4",
        "no_value",
        'inf_metric{} +Inf',
    ])
    samples = parse_prometheus_text(text)
    by_name = {n: (labels, v) for n, labels, v in samples}
    assert by_name["vllm:num_requests_running"] == (
        {"engine": "0", "model_name": 'my model, v"2"'}, 3.0)
    assert by_name["plain_metric"] == ({}, 7.0)
    assert by_name["weird"][0] == {"a": "}"} and math.isnan(by_name["weird"][1])
    assert by_name["inf_metric"][1] == math.inf
    assert "broken" not in by_name and "no_value" not in by_name


VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 4.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 5.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.3
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} {prompt}
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} {gen}
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 200.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 50.0
"""


def _vllm(prompt: float, gen: float) -> str:
    return VLLM_METRICS.replace("{prompt}", str(prompt)).replace("{gen}", str(gen))


def test_metrics_parser_reads_vllm_gauges_and_counter_rates():
    parser = MetricsLoadParser(instance_id="vllm-1")
    first = parser.parse(_vllm(1000, 100), now=10.0)
    assert (first.num_running, first.num_waiting) == (6, 6)
    assert first.kv_cache_usage == pytest.approx(0.4)
    assert first.model == "Qwen/Qwen3-0.6B"
    assert first.prefix_cache_hit_rate == pytest.approx(0.25)
    assert first.tokens_per_s == 0.0  # no previous scrape yet
    assert first.max_num_seqs == 0 and first.ready and not first.draining
    assert first.timestamp == 10.0

    second = parser.parse(_vllm(1400, 300), now=12.0)
    assert second.tokens_per_s == pytest.approx((400 + 200) / 2)
    assert second.generation_tokens_per_s == pytest.approx(100)

    restarted = parser.parse(_vllm(10, 5), now=13.0)  # counters went down: no rate
    assert restarted.tokens_per_s == 0.0


def test_metrics_parser_reads_legacy_vllm_and_llamacpp_names():
    legacy = "vllm:gpu_cache_usage_perc 0.75\nvllm:num_requests_running 1\n" \
             "vllm:gpu_prefix_cache_hit_rate 0.6\n"
    r = MetricsLoadParser("a", model="m").parse(legacy, now=0.0)
    assert (r.kv_cache_usage, r.num_running, r.prefix_cache_hit_rate) == (0.75, 1, 0.6)
    assert r.model == "m" and r.busy_fraction == 1.0

    llamacpp = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 3\n" \
               "llamacpp:kv_cache_usage_ratio 0.1\n"
    r = MetricsLoadParser("b").parse(llamacpp, now=0.0)
    assert (r.num_running, r.num_waiting, r.kv_cache_usage) == (2, 3, 0.1)


def test_metrics_parser_on_unrelated_text_gives_an_idle_report():
    r = MetricsLoadParser("x").parse("process_cpu_seconds_total 12\n", now=5.0)
    assert (r.num_running, r.num_waiting, r.kv_cache_usage, r.busy_fraction) == (0, 0, 0.0, 0.0)
