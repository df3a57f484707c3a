"""The limiter's decisions, pure: what a request reserves, and what a store's reply means.

A store (in memory or Redis) knows one atomic operation, ``reserve``: given counters
with a cost and a cap each, add every cost if every counter stays within its cap, else
add nothing and say which one refused. Everything else is decided here, so both stores
(and the tests) share it:

- **windows** (requests and tokens): a counter is a hash of buckets, ``BUCKETS`` per
  window. A request counts in its bucket; the ones counted are the current bucket and
  the ``BUCKETS`` before it, a span of one to ``1 + 1/BUCKETS`` windows. Since that span
  always covers the last ``window_s``, no window of that length ever holds more than the
  cap (a fixed window lets twice the cap through across its edge); the price is that a
  request may wait up to one bucket longer than an exact sliding log would make it.
- **budgets**: one bucket per calendar period (UTC), so a new period starts from zero.
- **holds** (concurrent requests): a sorted set of request ids scored by when the hold
  lapses, so the holds of a replica that died expire instead of leaking.

Budget amounts are integer millionths (``MICRO``): Redis adds integers exactly.
"""

from __future__ import annotations

import calendar
import math
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from enum import Enum

from llmserve.gateway.tenants.config import KeyLimits, Period, Prices

BUCKETS = 10
MICRO = 1_000_000


class Kind(str, Enum):
    WINDOW = "w"  # a hash of bucket -> amount
    HOLD = "h"  # a sorted set of request id -> expiry


class Limit(str, Enum):
    """Which cap refused: the metric label and the error's wording."""

    REQUESTS = "requests"
    TOKENS = "tokens"
    CONCURRENT = "concurrent"
    BUDGET = "budget"


@dataclass(frozen=True, slots=True)
class Ask:
    """One counter of one reservation."""

    limit: Limit
    key: str
    kind: Kind
    cost: int
    cap: int
    field: int = 0  # WINDOW: the bucket this reservation lands in
    oldest: int = 0  # WINDOW: the oldest bucket still counted (older ones are dropped)
    ttl_s: int = 0  # how long the store keeps the counter (0: for ever); HOLD: the hold's lease
    member: str = ""  # HOLD: the request's id
    width_s: float = 0.0  # WINDOW of a rate: the bucket's length
    resets_at: float | None = None  # budgets: when the period ends (None: a total, never)
    money: bool = False  # budgets: counted in millionths of the currency, not tokens


@dataclass(frozen=True, slots=True)
class Reply:
    """A store's answer to ``reserve``: ``failed`` is the index of the ask that refused
    (-1: all reserved); ``used`` what each counter held before; ``buckets`` the refusing
    window's (bucket, amount) pairs, for Retry-After."""

    failed: int
    used: tuple[int, ...]
    buckets: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Denied:
    limit: Limit
    retry_after_s: int | None  # None: waiting never helps (the ask exceeds the whole limit)
    message: str

    @property
    def type(self) -> str:  # OpenAI's error types for these
        return {Limit.BUDGET: "insufficient_quota", Limit.TOKENS: "tokens"}.get(self.limit, "requests")

    @property
    def code(self) -> str:
        return "insufficient_quota" if self.limit is Limit.BUDGET else "rate_limit_exceeded"


def counter_key(name: str, limit: Limit) -> str:
    # The braces are a Redis Cluster hash tag: one key's counters share a slot, as a script needs.
    return f"llmserve:key:{{{name}}}:{limit.value}"


def window(now: float, window_s: float) -> tuple[int, int, float]:
    """(current bucket, oldest bucket counted, bucket width) of a rate window at ``now``."""
    width = window_s / BUCKETS
    field = math.floor(now / width)
    return field, field - BUCKETS, width


def period_span(period: Period, now: float) -> tuple[int, float | None]:
    """(the period's number, when it ends) at ``now``, in UTC."""
    if period is Period.TOTAL:
        return 0, None
    if period is Period.MONTH:
        t = datetime.fromtimestamp(now, timezone.utc)
        nxt = (t.year + (t.month == 12), t.month % 12 + 1)
        return t.year * 12 + t.month - 1, float(calendar.timegm((*nxt, 1, 0, 0, 0)))
    if period is Period.WEEK:  # Monday to Monday: 1970-01-01 was a Thursday
        idx = math.floor((now / 86400 + 3) / 7)
        return idx, float(((idx + 1) * 7 - 3) * 86400)
    length = 3600 if period is Period.HOUR else 86400
    idx = math.floor(now / length)
    return idx, float((idx + 1) * length)


def estimate(limits: KeyLimits, prompt_chars: int, body: dict) -> tuple[int, int]:
    """(prompt, completion) tokens reserved at admission, before the usage is known.

    Prompts are estimated high (3 characters a token, plus a message template's worth)
    so that settling mostly gives back; completions at their max_tokens, per choice of
    every prompt (a completions list of prompts answers each)."""
    prompt = prompt_chars // 3 + 8
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    p = body.get("prompt")
    prompts = len(p) if isinstance(p, list) and p and not isinstance(p[0], int) else 1
    choices = max(int(body.get("n") or 1), int(body.get("best_of") or 1)) * prompts
    completion = (int(asked) if isinstance(asked, int) and asked > 0 else limits.default_max_tokens) * choices
    return prompt, completion


def spend(prices: Prices, prompt: int, completion: int) -> int:
    """Millionths of the budget's currency that ``prompt`` + ``completion`` tokens cost."""
    return math.ceil(prompt * prices.prompt * (MICRO / 1000) + completion * prices.completion * (MICRO / 1000))


def budget_cost(limits: KeyLimits, prices: Prices, prompt: int, completion: int) -> int:
    """What the budget counts for these tokens: money, or the tokens themselves."""
    b = limits.budget
    if b is None:
        return 0
    return prompt + completion if b.tokens is not None else spend(prices, prompt, completion)


def budget_cap(limits: KeyLimits) -> int:
    b = limits.budget
    assert b is not None
    return b.tokens if b.tokens is not None else round(b.amount * MICRO)


def token_asks(name: str, limits: KeyLimits, prices: Prices, prompt: int, completion: int,
               now: float) -> list[Ask]:
    """The token window and the budget, for ``prompt`` + ``completion`` more tokens."""
    asks = []
    if limits.token_cap is not None:
        field, oldest, width = window(now, limits.window_s)
        asks.append(Ask(Limit.TOKENS, counter_key(name, Limit.TOKENS), Kind.WINDOW, prompt + completion,
                        limits.token_cap, field, oldest, math.ceil(limits.window_s * 2) + 1, width_s=width))
    if limits.budget is not None:
        idx, end = period_span(limits.budget.period, now)
        ttl = 0 if end is None else math.ceil(end - now) + 86400
        asks.append(Ask(Limit.BUDGET, counter_key(name, Limit.BUDGET), Kind.WINDOW,
                        budget_cost(limits, prices, prompt, completion), budget_cap(limits), idx, idx, ttl,
                        resets_at=end, money=limits.budget.tokens is None))
    return asks


def admission_asks(name: str, limits: KeyLimits, prices: Prices, prompt: int, completion: int,
                   now: float, request_id: str, hold_s: float) -> list[Ask]:
    """Everything a new request reserves: one request, its estimated tokens, a hold."""
    asks = []
    if limits.request_cap is not None:
        field, oldest, width = window(now, limits.window_s)
        asks.append(Ask(Limit.REQUESTS, counter_key(name, Limit.REQUESTS), Kind.WINDOW, 1, limits.request_cap,
                        field, oldest, math.ceil(limits.window_s * 2) + 1, width_s=width))
    asks += token_asks(name, limits, prices, prompt, completion, now)
    if limits.max_concurrent is not None:
        asks.append(Ask(Limit.CONCURRENT, counter_key(name, Limit.CONCURRENT), Kind.HOLD, 1,
                        limits.max_concurrent, ttl_s=math.ceil(hold_s), member=request_id))
    return asks


def verdict(name: str, asks: list[Ask], reply: Reply, now: float) -> Denied | None:
    """None when every counter took its cost; else why not and when to try again."""
    if reply.failed < 0:
        return None
    ask, used = asks[reply.failed], reply.used[reply.failed]
    if ask.kind is Kind.HOLD:
        return Denied(ask.limit, 1, f"key {name!r} has {used} requests in flight, its limit of "
                                    f"{ask.cap} concurrent requests")
    if ask.limit is Limit.BUDGET:
        return _budget_denied(name, ask, used, now)
    unit = ask.limit.value
    window_s = ask.width_s * BUCKETS
    if ask.cost > ask.cap:
        return Denied(ask.limit, None, f"the request needs {ask.cost} {unit}, more than key "
                                                      f"{name!r} may use per {window_s:g} s ({ask.cap})")
    return Denied(ask.limit, retry_after(ask, reply.buckets, used, now),
                  f"key {name!r} reached its limit of {ask.cap} {unit} per {window_s:g} s "
                  f"({used} used, this request needs {ask.cost})")


def _budget_denied(name: str, ask: Ask, used: int, now: float) -> Denied:
    def said(v: int) -> str:  # (money in the prices' currency, not the counter's millionths)
        return f"{v / MICRO:.6g}" if ask.money else f"{v} tokens"

    if ask.cost > ask.cap:  # no period's start lets it through
        return Denied(ask.limit, None, f"the request needs {said(ask.cost)}, more than key {name!r}'s whole "
                                       f"budget ({said(ask.cap)}); ask for fewer tokens (max_tokens)")
    wait = None if ask.resets_at is None else max(1, math.ceil(ask.resets_at - now))
    period = "its budget" if wait is None else "its budget for this period"
    return Denied(ask.limit, wait, f"key {name!r} has too little left of {period}: {said(used)} of "
                                   f"{said(ask.cap)} spent, this request needs {said(ask.cost)}")


def rate_headers(asks: list[Ask], reply: Reply, now: float) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the key's windows
    (as far as the store counted them): the cap, what is left after this request (before it,
    when refused), and the time until the window is whole again, as OpenAI writes it (``6m0s``)."""
    out: dict[str, str] = {}
    for i, ask in enumerate(asks[:len(reply.used)]):
        if ask.limit not in (Limit.REQUESTS, Limit.TOKENS):
            continue
        taken = ask.cost if reply.failed < 0 else 0
        unit = ask.limit.value
        out[f"x-ratelimit-limit-{unit}"] = str(ask.cap)
        out[f"x-ratelimit-remaining-{unit}"] = str(max(0, ask.cap - reply.used[i] - taken))
        out[f"x-ratelimit-reset-{unit}"] = duration((ask.field + BUCKETS + 1) * ask.width_s - now)
    return out


def duration(seconds: float) -> str:
    """``17ms``, ``1s``, ``6m0s``: how OpenAI's rate-limit headers say a wait."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, secs = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def retry_after(ask: Ask, buckets: tuple[tuple[int, int], ...], used: int, now: float) -> int:
    """Seconds until enough old buckets have left the window for ``ask`` to fit."""
    need, freed = used + ask.cost - ask.cap, 0
    for field, amount in sorted(buckets):
        freed += amount
        if freed >= need:  # bucket ``field`` stops counting once BUCKETS newer ones began
            return max(1, math.ceil((field + BUCKETS + 1) * ask.width_s - now))
    return max(1, math.ceil(ask.width_s * (BUCKETS + 1)))


def local_share(ask: Ask, replicas: int, known_used: int | None) -> Ask:
    """The ask as one of ``replicas`` gateways enforces it alone while the store is away:
    a 1/N share of the cap (at least one request), of a budget what was left of it."""
    if replicas <= 1 and known_used is None:
        return ask
    if ask.limit is Limit.BUDGET:
        left = max(0, ask.cap - (known_used or 0))
        return replace(ask, cap=left // max(1, replicas))
    return replace(ask, cap=max(1, ask.cap // max(1, replicas)))
