from llmserve.autoscale.reconcile import InstanceStatus, plan_scaling
from llmserve.lifecycle import InstanceState as S


def pool(*specs):
    return [InstanceStatus(i, state, in_flight, since) for i, (state, in_flight, since) in enumerate(specs)]


def test_scale_up_revives_draining_before_starting_new():
    p = plan_scaling(4, pool((S.READY, 3, 0), (S.DRAINING, 1, 5), (S.DRAINING, 4, 6), (S.STOPPED, 0, 0)))
    assert p.revive == [2, 1]
    assert p.start == 1


def test_scale_down_cancels_the_youngest_starting_then_warming_then_drains_idle_ready():
    instances = pool((S.READY, 5, 0), (S.READY, 0, 1), (S.WARMING, 0, 10), (S.STARTING, 0, 20),
                     (S.STARTING, 0, 30))
    assert plan_scaling(4, instances).cancel == [4]
    p = plan_scaling(1, instances)
    assert p.cancel == [4, 3, 2]
    assert p.drain == [1]  # the busy one keeps serving


def test_nothing_to_do():
    assert plan_scaling(2, pool((S.READY, 0, 0), (S.WARMING, 0, 0), (S.DRAINING, 0, 0))).empty
