"""Whole runs against the fake streaming server: counts, failures, concurrency, dependencies."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.bench import datasets
from llmserve.bench.client import EndpointConfig
from llmserve.bench.metrics import summarize
from llmserve.bench.runner import run_requests
from llmserve.bench.tokenizer import load_tokenizer

WORDS = load_tokenizer(None)


def run(url, reqs, offsets=None, **kw):
    cfg = EndpointConfig(base_url=url, model="fake-model", ignore_eos=kw.pop("ignore_eos", True),
                         endpoint=kw.pop("endpoint", "completions"))
    offsets = [0.0] * len(reqs) if offsets is None else offsets
    return asyncio.run(run_requests(cfg, reqs, offsets, show_progress=False, **kw))


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_happy_path_counts_match_the_server(fake_server, endpoint):
    reqs = datasets.random_dataset(WORDS, 12, input_len=20, output_len=6, range_ratio=0.5, seed=0)
    warm = datasets.random_dataset(WORDS, 2, input_len=20, output_len=6, seed=1)
    out = run(fake_server.url("/ok/v1"), reqs, endpoint=endpoint, warmups=warm)
    s = summarize(out.records, out.duration_s)
    st = fake_server.stats
    assert len(out.warmup_records) == 2 and all(r.success for r in out.warmup_records)
    assert st.requests == 12 + 2
    assert (s.completed, s.failed) == (12, 0)
    warm_out = sum(r.output_tokens for r in out.warmup_records)
    assert s.total_output_tokens == st.completion_tokens - warm_out == sum(r.output_len for r in reqs)
    assert s.server_prompt_tokens == s.total_input_tokens == sum(r.prompt_len for r in reqs)
    assert all(r.output_source.value == "usage" for r in out.records)
    assert s.tpot.count == 12 and s.itl.count > 0


def test_mixed_failures_are_reported_not_hidden(fake_server):
    reqs = datasets.random_dataset(WORDS, 10, 5, 3, seed=0)
    out = run(fake_server.url("/mixed/v1"), reqs, max_concurrency=1)
    s = summarize(out.records, out.duration_s)
    assert (s.num_requests, s.completed, s.failed) == (10, 5, 5)
    assert s.failures_by_kind == {"http_503": 5}
    assert s.total_output_tokens == fake_server.stats.completion_tokens == 15


def test_max_concurrency_caps_requests_in_flight(fake_server):
    reqs = datasets.random_dataset(WORDS, 8, 5, 10, seed=0)
    run(fake_server.url("/ok/v1"), reqs, max_concurrency=2)
    assert fake_server.stats.max_in_flight == 2
    fake_server.stats.max_in_flight = 0
    run(fake_server.url("/ok/v1"), reqs)
    assert fake_server.stats.max_in_flight > 2


def test_scheduled_offsets_are_honoured(fake_server):
    reqs = datasets.random_dataset(WORDS, 3, 5, 2, seed=0)
    out = run(fake_server.url("/ok/v1"), reqs, offsets=[0.0, 0.2, 0.4])
    starts = [r.start_s for r in out.records]
    assert [r.scheduled_s for r in out.records] == [0.0, 0.2, 0.4]
    assert all(s >= o for s, o in zip(starts, (0.0, 0.2, 0.4)))


def test_a_turn_waits_for_the_previous_turn(fake_server):
    reqs = datasets.multi_turn_dataset(WORDS, 6, turns=3, user_len=4, output_len=5, seed=0)
    out = run(fake_server.url("/ok/v1"), reqs)
    assert all(r.success for r in out.records)
    spans = fake_server.stats.spans
    for r in reqs:
        if r.depends_on is not None:
            prev = reqs[r.depends_on]
            assert spans[r.prompt][0] >= spans[prev.prompt][1]


def test_requests_beyond_the_planned_offsets_are_not_sent(fake_server):
    reqs = datasets.random_dataset(WORDS, 5, 5, 2, seed=0)
    out = run(fake_server.url("/ok/v1"), reqs, offsets=[0.0, 0.0])
    assert len(out.records) == 2 and fake_server.stats.requests == 2
