"""The limiter's pure decisions: windows never hold more than their cap, Retry-After,
budget periods, estimates, OpenAI's error types, and the local share."""

from __future__ import annotations

import asyncio
import calendar
import random

import pytest

from llmserve.gateway.tenants.config import Budget, KeyLimits, Period, Prices
from llmserve.gateway.tenants.decision import (BUCKETS, MICRO, Limit, Reply, admission_asks, budget_cost,
                                               estimate, local_share, period_span, retry_after, spend, verdict,
                                               window)
from llmserve.gateway.tenants.store import MemoryStore

FREE = Prices()


def _admit_all(limits: KeyLimits, times: list[float]) -> list[float]:
    store, admitted = MemoryStore(), []

    async def go():
        for i, t in enumerate(times):
            asks = admission_asks("k", limits, FREE, 0, 0, t, f"r{i}", 60)
            reply = await store.reserve(asks, t)
            if verdict("k", asks, reply, t) is None:
                admitted.append(t)
    asyncio.run(go())
    return admitted


def test_no_window_of_window_s_ever_holds_more_than_the_cap():
    """The claim in decision.py's docstring, over any window (not only aligned ones):
    a fixed window would let up to twice the cap through across its edge."""
    rng = random.Random(7)
    limits = KeyLimits(requests=20, window_s=5.0)
    t, times = 1_000_000.0, []
    for _ in range(3000):  # bursts and lulls, ~6 requests a second on average
        t += rng.expovariate(30.0) if rng.random() < 0.8 else rng.uniform(0.5, 3.0)
        times.append(t)
    admitted = _admit_all(limits, times)
    worst = max(sum(1 for u in admitted if s - 5.0 < u <= s) for s in admitted)
    assert worst <= 20
    # and it is not starving the key: over the run it gets most of what a sliding log would
    span = times[-1] - times[0]
    assert len(admitted) >= 0.8 * 20 * span / 5.0 * BUCKETS / (BUCKETS + 1) * 0.5


def test_a_steady_stream_gets_the_cap_per_window():
    limits = KeyLimits(requests=10, window_s=10.0)
    times = [1_000_000.0 + i * 0.05 for i in range(4000)]  # 20 a second for 200 s
    admitted = _admit_all(limits, times)
    assert 10 * 200 / 10 * BUCKETS / (BUCKETS + 1) - 10 <= len(admitted) <= 10 * 200 / 10 + 10


def test_retry_after_is_when_enough_old_buckets_leave():
    limits = KeyLimits(requests=3, window_s=10.0)
    now = 1_000_000.0
    field, oldest, width = window(now, 10.0)
    ask = admission_asks("k", limits, FREE, 0, 0, now, "r", 60)[0]
    # 2 in the oldest counted bucket, 1 in the current: one must leave -> when the oldest stops counting
    buckets = ((oldest, 2), (field, 1))
    wait = retry_after(ask, buckets, 3, now)
    assert wait == max(1, int(-(-((oldest + BUCKETS + 1) * width - now) // 1)))
    assert wait <= width + 1
    # needing the newest bucket gone too: about a whole window
    assert retry_after(ask, ((field, 3),), 3, now) >= 10


def test_period_spans_are_utc_calendar_periods():
    t = calendar.timegm((2026, 12, 31, 23, 30, 0))
    idx, end = period_span(Period.MONTH, t)
    assert end == calendar.timegm((2027, 1, 1, 0, 0, 0))
    assert period_span(Period.MONTH, end)[0] == idx + 1
    assert period_span(Period.DAY, t)[1] == calendar.timegm((2027, 1, 1, 0, 0, 0))
    assert period_span(Period.HOUR, t)[1] == calendar.timegm((2027, 1, 1, 0, 0, 0))
    monday = calendar.timegm((2027, 1, 4, 0, 0, 0))  # 2026-12-31 is a Thursday
    assert period_span(Period.WEEK, t)[1] == monday
    assert period_span(Period.TOTAL, t) == (0, None)


def test_estimates_reserve_max_tokens_per_choice_and_a_high_prompt():
    limits = KeyLimits(default_max_tokens=100)
    assert estimate(limits, 300, {"max_tokens": 7}) == (108, 7)
    assert estimate(limits, 0, {"max_completion_tokens": 5, "n": 3}) == (8, 15)
    assert estimate(limits, 0, {}) == (8, 100)
    # a completions list of prompts answers each: 8 prompts x 2 choices x 60 (ids: one prompt)
    assert estimate(limits, 0, {"prompt": list("abcdefgh"), "max_tokens": 60, "n": 2}) == (8, 960)
    assert estimate(limits, 0, {"prompt": [5, 6, 7], "max_tokens": 60}) == (8, 60)


def test_spend_is_priced_per_thousand_in_millionths():
    p = Prices(prompt=0.5, completion=2.0)
    assert spend(p, 1000, 1000) == 2.5 * MICRO
    assert spend(p, 1, 0) == 500
    tokens = KeyLimits(budget=Budget(tokens=100, period=Period.DAY))
    assert budget_cost(tokens, p, 3, 4) == 7


def test_verdicts_use_openais_error_types_and_name_the_key_not_its_secret():
    limits = KeyLimits(requests=1, tokens=50, max_concurrent=1, budget=Budget(amount=1.0, period=Period.DAY))
    now = 1_000_000.0
    asks = admission_asks("team-a", limits, Prices(prompt=1.0, completion=1.0), 10, 10, now, "r", 60)
    assert [a.limit for a in asks] == [Limit.REQUESTS, Limit.TOKENS, Limit.BUDGET, Limit.CONCURRENT]
    kinds = {}
    for i in range(len(asks)):
        d = verdict("team-a", asks, Reply(i, (0,) * i + (asks[i].cap,), ((asks[i].field, asks[i].cap),)), now)
        kinds[d.limit] = (d.type, d.code)
        assert "team-a" in d.message and d.retry_after_s >= 1
    assert kinds[Limit.REQUESTS] == ("requests", "rate_limit_exceeded")
    assert kinds[Limit.TOKENS] == ("tokens", "rate_limit_exceeded")
    assert kinds[Limit.CONCURRENT] == ("requests", "rate_limit_exceeded")
    assert kinds[Limit.BUDGET] == ("insufficient_quota", "insufficient_quota")
    assert verdict("team-a", asks, Reply(-1, (0, 0, 0, 0)), now) is None


def test_budget_refusals_say_amounts_as_configured_and_when_waiting_helps():
    """Money in the prices' currency (not the counter's millionths); a request over the whole
    budget, or a total budget spent, gets no Retry-After: no period's start would let it in."""
    now = 1_000_000.0
    money = KeyLimits(budget=Budget(amount=0.5, period=Period.TOTAL))
    big = admission_asks("k", money, Prices(prompt=1.0, completion=1.0), 10, 1000, now, "r", 60)
    d = verdict("k", big, Reply(0, (0,)), now)
    assert d.retry_after_s is None and "whole budget (0.5)" in d.message and "1.01" in d.message
    small = admission_asks("k", money, Prices(prompt=1.0, completion=1.0), 10, 10, now, "r", 60)
    d = verdict("k", small, Reply(0, (small[0].cap,)), now)
    assert d.retry_after_s is None and "0.5 of 0.5 spent" in d.message
    daily = KeyLimits(budget=Budget(tokens=100, period=Period.DAY))
    d = verdict("k", admission_asks("k", daily, FREE, 10, 10, now, "r", 60), Reply(0, (95,)), now)
    assert d.retry_after_s == 86400 - now % 86400 and "95 tokens of 100 tokens spent" in d.message


def test_a_request_larger_than_the_whole_window_says_so():
    limits = KeyLimits(tokens=50, window_s=10.0)
    asks = admission_asks("k", limits, FREE, 40, 40, 1_000_000.0, "r", 60)
    d = verdict("k", asks, Reply(0, (0,)), 1_000_000.0)
    # waiting never helps, so no Retry-After (a client would retry for ever)
    assert "more than key 'k' may use" in d.message and d.retry_after_s is None


def test_the_local_share_splits_caps_and_what_is_left_of_a_budget():
    limits = KeyLimits(requests=60, max_concurrent=2, budget=Budget(tokens=900, period=Period.DAY))
    asks = admission_asks("k", limits, FREE, 0, 0, 1_000_000.0, "r", 60)
    by = {a.limit: a for a in asks}
    assert local_share(by[Limit.REQUESTS], 3, None).cap == 20
    assert local_share(by[Limit.CONCURRENT], 3, None).cap == 1  # never zero
    assert local_share(by[Limit.BUDGET], 3, 600).cap == 100  # (900 - 600) / 3
    assert local_share(by[Limit.BUDGET], 3, None).cap == 300


@pytest.mark.parametrize("bad, match", [
    ({"requests_per_minute": 5, "requests": 5}, "not both"),
    ({"requests_per_minute": 5, "window_s": 10}, "window_s 60"),
    ({"budget": {"period": "day"}}, "either an amount or tokens"),
    ({"budget": {"amount": 1, "tokens": 5}}, "either an amount or tokens"),
    ({"budget": {"amount": 1, "period": "fortnight"}}, "period"),
    ({"request_per_minute": 5}, "request_per_minute"),
])
def test_bad_limits_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        KeyLimits.model_validate(bad)

