"""Issue 36 live: a real ``llmserve gateway`` in front of real tiny-model engines, the
canary analysis at the issue's settings. A canary failing 60 % of its requests is never
promoted; a healthy one is promoted after a bounded number of requests."""

from __future__ import annotations

import time

import pytest

from tests.gateway.test_gateway_engines import GatewayProcess, gateway_config
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

pytestmark = pytest.mark.slow

ISSUE = {"version": "canary", "stable": "v1", "start_weight": 0.3, "step_weight": 0.2,
         "max_weight": 0.5, "interval_s": 1, "failure_threshold": 2, "min_requests": 3,
         "latency_slack_s": 0.05}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=1024)
    logs = tmp_path_factory.mktemp("logs")
    specs = {"v1": [], "good": [], "bad": ["--fault-error-rate", "0.6"]}
    procs = {name: start_engine(model, logs, "--served-model-name", "tiny", "--instance-id", name,
                                *args, wait=False) for name, args in specs.items()}
    try:
        for ep in procs.values():
            ep.wait_ready()
        yield procs, logs
    finally:
        for ep in procs.values():
            ep.stop()


def _rollout(engines, canary: str, max_requests: int) -> dict:
    """The issue's client: sequential chats (max_tokens 2), a new user each, the canary's
    state polled after each; until the rollout settles or ``max_requests``."""
    procs, logs = engines
    cfg = gateway_config({"v1": [procs["v1"].url], "canary": [procs[canary].url]},
                         weights={"v1": 1, "canary": 0}, canary=ISSUE)
    del cfg["breaker"]  # the gateway's defaults, as in the issue's run
    gw = GatewayProcess(cfg, logs)
    try:
        gw.wait_all_ready()
        t0, state, sent = time.monotonic(), "progressing", 0
        while state == "progressing" and sent < max_requests:
            gw.client.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": f"hello {sent}"}],
                "max_tokens": 2, "user": f"user-{canary}-{sent}"})
            sent += 1
            state = gw.admin("GET", "/models/tiny/canary").json()["state"]
        return {"state": state, "requests": sent, "seconds": time.monotonic() - t0,
                "history": gw.admin("GET", "/models/tiny/canary/history").json()["events"]}
    finally:
        gw.stop()


def test_a_canary_failing_60_percent_of_requests_is_never_promoted(engines):
    for _ in range(4):
        run = _rollout(engines, "bad", 3000)  # (settles in seconds: ~3 analysis intervals, whatever the request rate)
        assert run["state"] == "rolled_back", run["history"]
        assert not any(e["action"] in ("advance", "promote") for e in run["history"])
        assert "error rate canary" in run["history"][-1]["reason"]


def test_a_healthy_canary_is_promoted_after_a_bounded_number_of_requests(engines, capsys):
    run = _rollout(engines, "good", 8000)
    assert run["state"] == "promoted", run["history"][-3:]
    actions = [e["action"] for e in run["history"]]
    assert actions.count("advance") == 1 and actions[-1] == "promote"
    assert "hold" not in actions
    with capsys.disabled():  # the figure docs/canary.md records
        print(f"\nhealthy canary promoted after {run['requests']} requests, {run['seconds']:.0f} s")
