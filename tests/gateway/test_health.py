from llmserve.gateway.health import (OutlierConfig, OutlierDetector, RetryBudget,
                                     RetryBudgetConfig)

OCFG = OutlierConfig(window_s=10, min_requests=10, max_error_rate=0.5, ejection_s=5,
                     max_ejection_s=12, max_ejected_fraction=0.5)


def test_ejects_an_instance_failing_half_its_requests():
    d = OutlierDetector(OCFG)
    results = [d.record("a", ok=(k % 2 == 0), now=float(k) * 0.1, pool_size=4)
               for k in range(10)]
    assert results == [False] * 9 + [True]
    assert d.is_ejected("a", 1.0) and d.is_ejected("a", 5.8)
    assert not d.is_ejected("a", 5.9)
    assert not d.is_ejected("b", 1.0)


def test_needs_min_requests_and_forgets_old_outcomes():
    d = OutlierDetector(OCFG)
    for k in range(9):
        assert not d.record("a", ok=False, now=0.0, pool_size=4)
    # the 9 failures fall out of the window before the 10th request
    assert not d.record("a", ok=False, now=20.0, pool_size=4)
    assert not d.is_ejected("a", 20.0)


def test_never_ejects_more_than_the_allowed_fraction():
    d = OutlierDetector(OCFG)
    ejected = [any([d.record(name, ok=False, now=0.0, pool_size=4) for _ in range(10)])
               for name in "abcd"]
    assert ejected == [True, True, False, False]
    lone = OutlierDetector(OCFG)
    assert not any(lone.record("only", ok=False, now=0.0, pool_size=1) for _ in range(20))


def test_repeat_ejections_last_longer():
    d = OutlierDetector(OCFG)
    for _ in range(10):
        d.record("a", ok=False, now=0.0, pool_size=4)
    for _ in range(10):
        d.record("a", ok=False, now=6.0, pool_size=4)
    assert d.is_ejected("a", 15.9) and not d.is_ejected("a", 16.0)  # 10 s the second time


def test_retry_budget_has_a_floor_and_a_ratio():
    b = RetryBudget(RetryBudgetConfig(ratio=0.2, min_per_s=0.5, window_s=10))
    assert sum(b.try_acquire(0.0) for _ in range(20)) == 5  # floor: 0.5/s × 10 s
    for _ in range(100):
        b.record_request(1.0)
    assert sum(b.try_acquire(1.0) for _ in range(100)) == 20  # + 20% of 100
    # the window slides: a second later nothing changed, 11 s later all is forgotten
    assert not b.try_acquire(2.0)
    assert sum(b.try_acquire(12.0) for _ in range(20)) == 5


def test_health_and_ready_answer_head_as_a_load_balancers_check_sends_it():
    from .app_harness import stack
    from .fake_upstream import Behaviour

    with stack({"v1": [Behaviour("a")]}) as s:
        for path in ("/health", "/ready"):
            r = s.client.head(path)
            assert r.status_code == 200 and r.content == b"", (path, r.status_code)
