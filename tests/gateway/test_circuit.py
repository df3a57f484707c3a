import pytest

from llmserve.gateway.circuit import BreakerConfig, BreakerState, CircuitBreaker

CFG = BreakerConfig(failure_threshold=3, cooloff_s=5.0, max_cooloff_s=12.0, probe_timeout_s=2.0)


def _opened(now=0.0) -> CircuitBreaker:
    b = CircuitBreaker(CFG)
    for _ in range(3):
        b.record_failure(now)
    return b


def test_opens_after_consecutive_failures_only():
    b = CircuitBreaker(CFG)
    for _ in range(5):
        b.record_failure(0.0)
        b.record_failure(0.0)
        b.record_success(0.0)  # breaks the run
    assert b.state(0.0) is BreakerState.CLOSED and b.available(0.0)
    assert b.record_failure(0.0) is BreakerState.CLOSED
    b.record_failure(0.0)
    assert b.record_failure(0.0) is BreakerState.OPEN
    assert not b.available(1.0) and not b.acquire(1.0)
    assert b.times_opened == 1


def test_half_open_lets_one_probe_through_and_closes_on_success():
    b = _opened()
    assert b.state(4.9) is BreakerState.OPEN
    assert b.state(5.0) is BreakerState.HALF_OPEN
    assert b.available(5.0)
    assert b.acquire(5.0)
    assert not b.available(5.1) and not b.acquire(5.1)  # the probe is out
    assert b.record_success(5.5) is BreakerState.CLOSED
    assert b.acquire(5.6) and b.acquire(5.6)


def test_failed_probe_reopens_with_doubled_cooloff_capped():
    b = _opened()
    assert b.acquire(5.0)
    assert b.record_failure(6.0) is BreakerState.OPEN
    assert b.state(15.9) is BreakerState.OPEN  # cool-off is now 10 s
    assert b.state(16.0) is BreakerState.HALF_OPEN
    b.acquire(16.0)
    b.record_failure(16.0)
    assert b.state(27.9) is BreakerState.OPEN  # 20 s capped at 12 s
    assert b.state(28.0) is BreakerState.HALF_OPEN
    b.acquire(28.0)
    b.record_success(28.0)
    # a fresh open after closing uses the base cool-off again
    for _ in range(3):
        b.record_failure(30.0)
    assert b.state(35.0) is BreakerState.HALF_OPEN


def test_a_lost_probe_frees_the_slot_after_its_timeout():
    b = _opened()
    assert b.acquire(5.0)
    assert not b.acquire(6.9)
    assert b.acquire(7.0)


def test_outcomes_while_open_are_ignored():
    b = _opened()
    assert b.record_success(1.0) is BreakerState.OPEN
    assert b.record_failure(1.0) is BreakerState.OPEN
    assert b.state(5.0) is BreakerState.HALF_OPEN  # cool-off not extended


@pytest.mark.parametrize("field,value", [("failure_threshold", 0), ("cooloff_s", 0)])
def test_config_validates(field, value):
    with pytest.raises(ValueError):
        BreakerConfig(**{field: value})
