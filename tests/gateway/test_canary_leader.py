"""Among replicas the canary is decided by one leader: a gateway told it does not lead a
model's rollout (``Gateway.decides``) takes no look at it, however much evidence it has;
once it leads, its looks resume from the same evidence."""

import time

from .app_harness import stack
from .fake_upstream import Behaviour
from .test_app_canary import CANARY


def test_a_replica_that_does_not_lead_takes_no_canary_decision():
    with stack({"v1": [Behaviour("stable", tokens=1)], "canary": [Behaviour("good", tokens=1)]},
               weights={"v1": 1, "canary": 0}, model={"canary": CANARY}) as s:
        leads = {"chat": False}
        s.gateway.decides = lambda model: leads[model]
        rt = s.gateway.models["chat"]
        for i in range(200):  # far more than a step needs (test_app_canary promotes on less)
            s.chat(f"q{i}", user=f"user-{i}")
        time.sleep(3 * CANARY["interval_s"])
        assert [e["action"] for e in rt.canary.events()] == ["start"]
        assert rt.canary.weight == CANARY["start_weight"]
        leads["chat"] = True  # it took the lease
        deadline = time.monotonic() + 60
        i = 0
        while rt.canary.state.value != "promoted":
            assert time.monotonic() < deadline, rt.canary.events()
            s.chat(f"r{i}", user=f"later-{i}")
            i += 1
        assert "advance" in [e["action"] for e in rt.canary.events()]
