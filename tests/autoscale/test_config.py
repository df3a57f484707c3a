import pytest

from llmserve.autoscale import AutoscaleConfig, BoundsConfig, build_policy
from llmserve.autoscale.config import PredictiveConfig, StaticConfig, ThresholdConfig
from llmserve.autoscale.signals import PoolSignals


def test_model_validate_builds_nested_sections():
    cfg = AutoscaleConfig.model_validate({"policy": "kpa", "bounds": {"max_instances": 7},
                                     "kpa": {"target_concurrency": 4}})
    assert cfg.policy == "kpa" and cfg.bounds.max_instances == 7 and cfg.kpa.target_concurrency == 4
    assert cfg.bounds.min_instances == 1  # default keeps scale-to-zero off


@pytest.mark.parametrize("bad", [{"policy": "magic"}, {"bounds": {"max_instances": 0}},
                                 {"bounds": {"bogus": 1}}, {"tick_s": 0}])
def test_invalid_config_is_rejected(bad):
    with pytest.raises(ValueError):
        AutoscaleConfig.model_validate(bad)


def test_threshold_band_must_be_ordered():
    with pytest.raises(ValueError):
        ThresholdConfig(scale_up_utilisation=0.3, scale_down_utilisation=0.5)
    with pytest.raises(ValueError):
        BoundsConfig(min_instances=5, max_instances=2)
    with pytest.raises(ValueError):
        PredictiveConfig(capacity_tokens_per_s=0)


def test_static_stack_holds_its_size_regardless_of_load():
    policy = build_policy(AutoscaleConfig(policy="static", static=StaticConfig(instances=5)))
    state = policy.initial_state()
    for t, ready in ((0, 0), (10, 5), (20, 5)):
        d = policy.decide(PoolSignals(now=t, ready=ready, arrival_rate=1000, queue_depth={"rt": 99}), state)
        state = d.state
        assert d.desired == 5


def test_a_static_pool_never_holds_fewer_than_min_instances():
    """A serve file's ``bounds.min_instances: 2`` with ``policy: static`` gave one instance
    (static.instances' default); the floor holds for every policy, live and simulated."""
    two = AutoscaleConfig(policy="static", bounds=BoundsConfig(min_instances=2, max_instances=2))
    assert build_policy(two).decide(PoolSignals(now=0, ready=0), build_policy(two).initial_state()).desired == 2
    five = AutoscaleConfig(policy="static", static=StaticConfig(instances=5), bounds=BoundsConfig(min_instances=2))
    assert build_policy(five).decide(PoolSignals(now=0, ready=0), build_policy(five).initial_state()).desired == 5


def test_a_static_pool_above_max_instances_is_refused():
    """``static.instances`` over ``bounds.max_instances`` was run as given, past the bound."""
    with pytest.raises(ValueError, match=r"static\.instances .*bounds\.max_instances"):
        AutoscaleConfig.model_validate({"policy": "static", "static": {"instances": 5},
                                        "bounds": {"max_instances": 4}})
    AutoscaleConfig(policy="static", static=StaticConfig(instances=4), bounds=BoundsConfig(max_instances=4))
    # Only the static policy holds static.instances: another policy ignores it.
    AutoscaleConfig(policy="kpa", static=StaticConfig(instances=5), bounds=BoundsConfig(max_instances=4))
