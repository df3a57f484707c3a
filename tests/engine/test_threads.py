import pytest

from llmserve.engine.config import EngineConfig
from llmserve.engine.threads import engine_threads


def test_an_instance_gets_its_share_of_the_cores():
    assert [engine_threads(c) for c in (1, 2, 3, 4, 8, 16)] == [1, 2, 3, 4, 8, 16]
    assert engine_threads(16, 4) == 4 and engine_threads(2, 4) == 1 and engine_threads(8, 3) == 2


@pytest.mark.parametrize("bad", [{"batch_min_share": 1.0}, {"long_prefill_token_threshold": -1},
                                 {"step_budget_tokens": -1}, {"step_time_budget_s": 0.0}])
def test_scheduler_settings_are_refused_with_the_engine_config(bad):
    with pytest.raises(ValueError):
        EngineConfig(**bad)
