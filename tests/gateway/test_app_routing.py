"""Version routing through the live gateway: weights, stickiness, the override header."""

import math
from collections import Counter

from .app_harness import CLIENT_KEY, OPS_KEY, PRIVILEGED_AUTH, stack
from .fake_upstream import Behaviour


def test_weights_stickiness_and_header_override():
    with stack({"v1": [Behaviour("a", tokens=1)], "v2": [Behaviour("b", tokens=1)]},
               weights={"v1": 70, "v2": 30}, auth=PRIVILEGED_AUTH, client_key=CLIENT_KEY) as s:
        n = 300
        versions = Counter(s.chat(user=f"user-{i}").headers["x-llmserve-version"]
                           for i in range(n))
        bound = 5 * math.sqrt(0.7 * 0.3 / n)
        assert abs(versions["v1"] / n - 0.7) < bound, versions
        assert s.fakes["a"].requests == versions["v1"]

        # sticky: a user keeps its version, by body field or by header
        for i in range(20):
            first = s.chat(user=f"sticky-{i}").headers["x-llmserve-version"]
            assert s.chat(user=f"sticky-{i}").headers["x-llmserve-version"] == first
            assert s.chat(headers={"x-user-id": f"sticky-{i}"}).headers[
                "x-llmserve-version"] == first

        # the header forces a version, from a key that may
        for _ in range(10):
            r = s.chat(user="someone", headers={"x-llmserve-version": "v2"}, key=OPS_KEY)
            assert r.headers["x-llmserve-version"] == "v2"

        text = s.client.get("/metrics").text
        assert 'llmserve:gateway_routed_total{model="chat",reason="header",version="v2"} 10.0' \
            in text


def test_anonymous_requests_follow_the_weights():
    with stack({"v1": [Behaviour("a", tokens=1)], "v2": [Behaviour("b", tokens=1)]},
               weights={"v1": 1, "v2": 0}) as s:
        assert all(s.chat().headers["x-llmserve-version"] == "v1" for _ in range(30))
        assert s.fakes["b"].requests == 0
