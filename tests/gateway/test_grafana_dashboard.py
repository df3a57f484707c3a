"""The Grafana dashboard's gateway queries name series the gateway exports, grouped by
labels those series have (the multi-pool panels group by version)."""

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from .app_harness import stack
from .fake_upstream import Behaviour

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def test_every_gateway_series_the_dashboard_groups_by_version_exists_with_those_labels():
    # Failures, retries and resumed streams, so that every labelled series has a child.
    with stack({"v1": [Behaviour("a", error_rate=0.5), Behaviour("a2", error_rate=0.5, seed=1)],
                "v2": [Behaviour(n, tokens=4, break_after_tokens=2) for n in ("b", "b2")]},
               retry={"max_attempts": 2}) as s:
        for i in range(8):
            s.chat(f"q{i}", user=f"u{i}")
            s.chat(f"q{i}", user=f"u{i}", stream=True)  # (TTFT is a stream's)
        text = s.client.get("/metrics").text
    labels: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    dash = json.loads(DASHBOARD.read_text())
    grouped_by_version = 0
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            names = set(re.findall(r"llmserve:gateway_[a-z0-9_]+", t["expr"]))
            for name in names:
                assert name in labels, f"{panel['title']}: {name} is not exported"
            have = set().union(*(labels[n] for n in names)) if names else set()
            for group in re.findall(r"by \(([^)]*)\)", t["expr"]):
                wanted = {g.strip() for g in group.split(",")} - {"le"}
                assert not names or wanted <= have, f"{panel['title']}: {wanted - have} not labels of {names}"
                grouped_by_version += bool(names) and "version" in wanted
    assert grouped_by_version >= 5  # the rollout row: one line per pool
    titles = [p["title"] for p in dash["panels"]]
    assert "Traffic weight by version" in titles and "Instances by version and state" in titles
