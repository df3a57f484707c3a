import pytest

from llmserve.gateway.instance import InstanceView
from llmserve.load_report import LoadReport


def load_report(**overrides) -> LoadReport:
    fields = dict(
        instance_id="i", model="m", ready=True, draining=False, num_running=0, num_waiting=0,
        num_waiting_by_priority={}, kv_cache_usage=0.0, busy_fraction=0.0, tokens_per_s=0.0,
        generation_tokens_per_s=0.0, max_num_seqs=8, prefix_cache_hit_rate=0.0, timestamp=0.0)
    fields.update(overrides)
    return LoadReport(**fields)


def instance(instance_id: str, *, report: dict | None = None, **kw) -> InstanceView:
    rep = None if report is None else load_report(instance_id=instance_id, **report)
    return InstanceView(instance_id=instance_id, url=f"http://{instance_id}", report=rep, **kw)


@pytest.fixture
def make_report():
    return load_report


@pytest.fixture
def make_instance():
    return instance
