"""A real ``llmserve engine``'s /metrics against vLLM's: the per-request histograms, the
aliases and the cache info exist with vLLM's names and buckets, the warm-up counts in
none of them, and no ``*_created`` series is written."""

from __future__ import annotations

import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmserve.engine.request import Request
from llmserve.engine.outputs import RequestMetrics
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.stats import WARMUP_ID_PREFIX, EngineStats, Hist
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

MAX_LEN = 256


def _port() -> int:
    for port in range(8900, 9000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8900-8999")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=MAX_LEN)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny", port=_port())
    yield ep
    ep.stop()


def scrape(ep) -> tuple[dict, dict]:
    """(family name -> type, sample name -> {labels as a sorted tuple: value})."""
    text = httpx.get(ep.url + "/metrics").text
    types, samples = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return types, samples


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for k, v in samples.get(name, {}).items() if set(labels.items()) <= set(k))


def test_warmup_is_not_counted_then_a_request_fills_vllms_histograms(engine):
    types, s = scrape(engine)
    # the instance warmed up (4 rows x 32 tokens, 8 out) before /ready: none of it shows
    for name in ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:prefix_cache_queries_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:request_prompt_tokens_count",
                 "vllm:iteration_tokens_total_count"):
        assert total(s, name) == 0, name
    assert not [n for n in s if n.endswith("_created")]
    assert not [n for n in types if n.endswith("_created")]

    prompt, out = list(range(5, 45)), 12
    r = httpx.post(engine.url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": out, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    types, s = scrape(engine)
    hists = ["vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_max_tokens",
             "vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
             "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
             "vllm:request_inference_time_seconds", "vllm:request_queue_time_seconds",
             "vllm:iteration_tokens_total"]
    for name in hists:
        assert types[name] == "histogram", name
        assert {k[0] for k in s[name + "_count"]} == {("model_name", "tiny")}, name
    assert total(s, "vllm:request_success_total", finished_reason="length") == 1
    assert total(s, "vllm:prompt_tokens_total") == len(prompt)
    assert total(s, "vllm:generation_tokens_total") == out
    assert total(s, "vllm:prefix_cache_queries_total") == len(prompt)
    assert total(s, "vllm:request_prompt_tokens_sum") == len(prompt)
    assert total(s, "vllm:request_generation_tokens_sum") == out
    assert total(s, "vllm:request_params_max_tokens_sum") == out
    for name in hists[3:8]:
        if name == "vllm:time_per_output_token_seconds":  # vLLM's older name of the inter-token one
            assert s[name + "_count"] == s["vllm:inter_token_latency_seconds_count"]
            assert s[name + "_sum"] == s["vllm:inter_token_latency_seconds_sum"]
        else:
            assert total(s, name + "_count") == 1, name
    prefill, decode, inference = (total(s, f"vllm:request_{p}_time_seconds_sum")
                                  for p in ("prefill", "decode", "inference"))
    assert prefill > 0 and decode > 0 and inference == pytest.approx(prefill + decode)
    assert total(s, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(decode / (out - 1))
    assert total(s, "vllm:iteration_tokens_total_count") >= out
    assert total(s, "vllm:iteration_tokens_total_sum") >= len(prompt) + out - 1
    # vLLM's 1-2-5 token buckets stop at max_model_len; its TTFT bounds start at 1 ms
    les = [dict(k)["le"] for k in s["vllm:request_prompt_tokens_bucket"]]
    assert les == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "+Inf"]
    assert total(s, "vllm:request_prompt_tokens_bucket", le="50.0") == 1
    assert total(s, "vllm:request_prompt_tokens_bucket", le="20.0") == 0
    assert [dict(k)["le"] for k in s["vllm:time_to_first_token_seconds_bucket"]][:2] == ["0.001", "0.005"]
    assert total(s, "vllm:gpu_cache_usage_perc") == total(s, "vllm:kv_cache_usage_perc")
    (info, one), = s["vllm:cache_config_info"].items()
    info = dict(info)
    assert one == 1 and info["block_size"] == "16" and info["enable_prefix_caching"] == "True"
    assert info["engine"] == "0" and int(info["num_gpu_blocks"]) > 0 and info["cache_dtype"]


def _finish(stats: EngineStats, rid: str, prompt: int, out: int, t: tuple[float, float, float, float]) -> None:
    req = Request(rid, list(range(prompt)), SamplingParams(max_tokens=out), out)
    req.all_token_ids += [1] * out
    stats.on_first_token(req, t[2])
    stats.on_tokens(req, out, t[3])
    stats.on_finished(req, "length", RequestMetrics(t[0], t[1], t[2], t[3], t[3]))


def test_stats_phases_and_warmup_exclusion():
    stats = EngineStats()
    _finish(stats, f"{WARMUP_ID_PREFIX}0", 32, 8, (0.0, 0.0, 0.1, 0.5))
    assert stats.prompt_tokens == stats.generation_tokens == 0 and stats.finished == {}
    assert all(h.sum == 0 for h in stats.hists.values())
    _finish(stats, "r1", 10, 5, (1.0, 1.5, 2.0, 3.0))
    h = stats.hists
    assert stats.finished == {"length": 1} and stats.prompt_tokens == 10 and stats.generation_tokens == 5
    assert h["request_prefill_time_seconds"].sum == pytest.approx(0.5)
    assert h["request_decode_time_seconds"].sum == pytest.approx(1.0)
    assert h["request_inference_time_seconds"].sum == pytest.approx(1.5)
    assert h["request_time_per_output_token_seconds"].sum == pytest.approx(0.25)  # 1 s over 4 gaps


def test_hist_bound_is_inclusive():
    h = Hist((1.0, 2.0))
    for v in (1.0, 1.5, 3.0):
        h.observe(v)
    assert h.counts == [1, 1, 1] and h.sum == 5.5
