"""The dashboard's rollout timeline in headless Chromium during a live canary: both
pools' weights and instances on one axis, the analysis' verdicts as marks, updated
without a reload until the canary is promoted."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from tests.autoscale.cdp import Browser, find_browser

from .app_harness import ADMIN_KEY, stack
from .fake_upstream import Behaviour

pytestmark = pytest.mark.slow

CANARY = {"version": "canary", "stable": "v1", "start_weight": 0.1, "step_weight": 0.3, "max_weight": 0.7,
          "interval_s": 1.5, "failure_threshold": 2, "min_requests": 3, "latency_slack_s": 0.05,
          # wide margins: a verdict on a few dozen requests (the statistics are not under test here)
          "max_error_rate_delta": 0.05, "max_refusal_rate_delta": 0.05}
VIEW = """document.readyState !== "complete" ? null : JSON.stringify({  // null while the page loads
  paths: Object.fromEntries([...document.querySelectorAll('#chart-timeline path')].map(p =>
    [p.dataset.series, {points: Number(p.dataset.points), d: p.getAttribute('d')}])),
  marks: [...document.querySelectorAll('#chart-timeline line[data-kind]')].map(l => [l.dataset.kind, l.dataset.action]),
  listed: [...document.querySelectorAll('#timeline-marks li')].map(li => li.textContent.replace(/\\s+/g, ' ').trim()),
  error: document.getElementById('error').textContent,
})"""


def watch(browser: Browser, predicate, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    view: dict = {}
    while time.monotonic() < deadline:
        raw = browser.evaluate(VIEW)
        view = json.loads(raw) if raw else {}
        if view:
            view["marks"] = [tuple(m) for m in view["marks"]]
        if view and predicate(view):
            return view
        time.sleep(0.3)
    raise AssertionError(f"the timeline never showed {what}; last view: {str(view)[:2000]}")


def heights(d: str) -> set[str]:
    """The distinct levels a step path goes through (its V commands and its start)."""
    return {p.split(",")[-1] for p in d.replace("M", " V").split(" V")[1:]}


def test_the_dashboard_draws_both_pools_of_a_live_canary_on_one_timeline(tmp_path):
    binary = find_browser()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium binary although scripts/setup.sh test installs it")
        pytest.skip("no chromium binary (scripts/setup.sh test installs it)")
    with stack({"v1": [Behaviour("stable", tokens=1)], "canary": [Behaviour("good", tokens=1)]},
               weights={"v1": 1, "canary": 0}, model={"canary": CANARY}) as s:
        s.gateway.timeline.interval_s = 0.2
        rt = s.gateway.models["chat"]
        stop = threading.Event()

        def traffic() -> None:
            i = 0
            while not stop.is_set():
                s.chat(f"q{i}", user=f"user-{i}")
                i += 1
                time.sleep(0.02)

        driver = threading.Thread(target=traffic, daemon=True)
        driver.start()
        browser = Browser(binary, tmp_path / "chromium-profile")
        try:
            browser.call("Page.enable")
            browser.call("Page.navigate", url=f"{s.url}/dashboard#key={ADMIN_KEY}")
            during = watch(browser, lambda v: ("canary", "advance") in v["marks"]
                           and v["paths"].get("weight:canary", {}).get("points", 0) >= 3, 60,
                           "the canary advancing")
            assert rt.canary.state.value == "progressing" or ("canary", "promote") in during["marks"]
            assert {"weight:v1", "weight:canary", "instances:v1", "instances:canary"} <= set(during["paths"])
            assert len(heights(during["paths"]["weight:canary"]["d"])) >= 2  # the weight moved on screen
            assert during["error"] == ""
            browser.screenshot(tmp_path / "timeline-during.png")
            # on a loaded machine the promotion may already be in ``during``: wait for a later poll all the same
            seen = during["paths"]["weight:canary"]["points"]
            after = watch(browser, lambda v: ("canary", "promote") in v["marks"]
                          and v["paths"].get("weight:canary", {}).get("points", 0) > seen, 60,
                          "the promotion, with samples after the advance")
            assert any("promote" in li and "100%" in li for li in after["listed"])
            browser.screenshot(tmp_path / "timeline-after.png")
        finally:
            stop.set()
            driver.join(timeout=10)
            browser.close()
