"""The scheduler as a pure planner: no model, no torch tensors."""

from __future__ import annotations

import pytest

from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.request import BATCH, REALTIME, Request, RequestStatus
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.scheduler import Scheduler, SchedulerConfig


def make(num_blocks=64, block_size=4, **cfg) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=cfg.pop("caching", True))
    return Scheduler(SchedulerConfig(**{"max_model_len": 1024, **cfg}), kv)


def req(rid, n_prompt, max_tokens=4, priority=REALTIME, t=0.0, first=0) -> Request:
    return Request(rid, list(range(first, first + n_prompt)), SamplingParams(max_tokens=max_tokens),
                   max_tokens, arrival_time=t, priority=priority)


def fake_step(s: Scheduler, token: int = 7):
    out = s.schedule()
    sampled = {x.request.request_id: [token] for x in out.scheduled if x.sample}
    return out, s.update_from_output(out, sampled)


def test_long_prompt_is_chunked_and_shares_steps_with_decodes():
    s = make(max_num_batched_tokens=8)
    s.add_request(req("short", 3, max_tokens=10, t=0))
    out, _ = fake_step(s)
    assert {x.request.request_id: x.num_tokens for x in out.scheduled} == {"short": 3}
    s.add_request(req("long", 20, t=1))
    out, _ = fake_step(s)
    # one decode token for "short" and a 7-token chunk of "long" in the same step
    assert {x.request.request_id: x.num_tokens for x in out.scheduled} == {"short": 1, "long": 7}
    assert not [x for x in out.scheduled if x.request.request_id == "long"][0].sample
    fake_step(s)
    out, _ = fake_step(s)
    longs = [x for x in out.scheduled if x.request.request_id == "long"]
    assert longs[0].num_tokens == 20 - 14 and longs[0].sample


def test_max_num_seqs_and_leaving_the_step_they_finish():
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(str(i), 4, max_tokens=2, t=i))
    out, fin = fake_step(s)
    assert {x.request.request_id for x in out.scheduled} == {"0", "1"}
    out, fin = fake_step(s)
    assert {r.request_id for r in fin} == {"0", "1"}
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in fin)
    out, _ = fake_step(s)
    assert {x.request.request_id for x in out.scheduled} == {"2"}


def test_stop_token_finishes_and_frees():
    s = make()
    r = req("a", 5, max_tokens=50)
    r.eos_token_ids = frozenset({7})
    s.add_request(r)
    _, fin = fake_step(s, token=7)
    assert fin == [r] and r.status is RequestStatus.FINISHED_STOPPED
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_never_fitting_request_is_rejected_at_once():
    s = make(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="fit"):
        s.add_request(req("big", 14, max_tokens=4))


def test_realtime_scheduled_before_batch_and_batch_not_starved():
    s = make(max_num_batched_tokens=4, max_num_seqs=8, batch_min_share=0.2)
    s.add_request(req("b", 40, max_tokens=2, priority=BATCH, t=0))
    for i in range(6):
        s.add_request(req(f"r{i}", 40, max_tokens=2, t=1 + i))
    out, _ = fake_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["r0"]
    batch_tokens = 0
    for _ in range(40):
        out, _ = fake_step(s)
        batch_tokens += sum(x.num_tokens for x in out.scheduled if x.request.request_id == "b")
    assert batch_tokens > 0.1 * 40 * 4  # it got a real share while realtime work remained


def test_preemption_picks_lowest_priority_latest_arrival_and_requeues_front():
    s = make(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    s.add_request(req("rt_old", 8, max_tokens=8, t=0, first=0))
    s.add_request(req("batch", 4, max_tokens=8, priority=BATCH, t=1, first=100))
    s.add_request(req("rt_new", 4, max_tokens=8, t=2, first=200))
    fake_step(s)
    preempted = []
    for _ in range(6):
        out, _ = fake_step(s)
        preempted += [r.request_id for r in out.preempted]
    assert preempted and preempted[0] == "batch"
    assert s.num_preemptions >= 1
    assert s.requests["batch"].num_preemptions >= 1


def test_abort_frees_blocks_immediately():
    s = make()
    s.add_request(req("a", 10, max_tokens=5))
    fake_step(s)
    assert s.kv.num_free_blocks < s.kv.num_blocks
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    assert s.kv.num_free_blocks == s.kv.num_blocks
    assert s.schedule().empty


def test_prefix_hit_skips_cached_tokens():
    s = make(block_size=4)
    s.add_request(req("a", 10, max_tokens=1))
    fake_step(s)
    s.add_request(req("b", 10, max_tokens=1))
    out, _ = fake_step(s)
    # 8 of 10 tokens (two full blocks) are cached; the last two are computed
    assert out.scheduled[0].num_tokens == 2
    assert s.kv.prefix_hits == 8 and s.kv.prefix_queries == 20


def test_waiting_realtime_is_not_stuck_behind_running_batch_prefill():
    s = make(max_num_batched_tokens=8, num_blocks=256)
    s.add_request(req("batch", 200, max_tokens=2, priority=BATCH, t=0))
    out, _ = fake_step(s)
    assert out.scheduled[0].num_tokens == 8  # the long batch prompt takes the whole budget
    s.add_request(req("rt", 5, max_tokens=2, t=1, first=500))
    out, _ = fake_step(s)
    got = {x.request.request_id: x.num_tokens for x in out.scheduled}
    # Realtime first, and its prefill step carries no batch prompt chunk, so it takes
    # no longer than on an idle engine; the batch prompt resumes at the next step.
    assert got == {"rt": 5}
    out, _ = fake_step(s)
    got = {x.request.request_id: x.num_tokens for x in out.scheduled}
    assert got == {"rt": 1, "batch": 7}


def test_batch_decodes_share_a_realtime_prefill_step_and_starved_batch_still_chunks():
    s = make(max_num_batched_tokens=16, num_blocks=256, batch_min_share=0.0)
    s.add_request(req("b-dec", 4, max_tokens=8, priority=BATCH, t=0))
    fake_step(s)  # prefilled: decoding from now on
    s.add_request(req("rt", 6, max_tokens=2, t=1, first=500))
    out, _ = fake_step(s)
    assert {x.request.request_id: x.num_tokens for x in out.scheduled} == {"rt": 6, "b-dec": 1}
    # Batch owed its share still gets prompt chunks while a long realtime prompt prefills.
    s2 = make(max_num_batched_tokens=8, num_blocks=256, batch_min_share=0.5)
    s2.add_request(req("batch", 100, max_tokens=2, priority=BATCH, t=0))
    s2.add_request(req("rt", 40, max_tokens=2, t=1, first=500))
    got = [{x.request.request_id: x.num_tokens for x in fake_step(s2)[0].scheduled} for _ in range(4)]
    assert sum(g.get("batch", 0) for g in got) >= 0.5 * 32 - 8, got


def test_long_prefill_token_threshold_caps_prompt_chunks_not_decodes():
    s = make(max_num_batched_tokens=64, num_blocks=256, long_prefill_token_threshold=10)
    s.add_request(req("a", 25, max_tokens=3))
    sizes = [fake_step(s)[0].scheduled[0].num_tokens for _ in range(5)]
    assert sizes == [10, 10, 5, 1, 1]


class _Unhashable(str):
    """A salt whose encoding raises on the ``fail_on``-th call (1: at admission, 2: at the first update)."""

    def __new__(cls, value: str, fail_on: int):
        s = super().__new__(cls, value)
        s.calls, s.fail_on = 0, fail_on
        return s

    def encode(self, *args, **kw):
        self.calls += 1
        if self.calls >= self.fail_on:
            raise UnicodeEncodeError("utf-8", str(self), 0, 1, "injected")
        return super().encode(*args, **kw)


@pytest.mark.parametrize("fail_on,where", [(1, "scheduling failed"), (2, "applying the step failed")])
def test_a_request_whose_salt_cannot_be_hashed_fails_alone_and_frees_its_blocks(fail_on, where):
    s = make(num_blocks=16, block_size=4)
    bad = req("bad", 6, t=0)
    bad.cache_salt = _Unhashable("salt", fail_on)
    s.add_request(bad)
    s.add_request(req("a", 6, t=1, first=10))
    s.add_request(req("b", 3, t=2, first=20))
    out, finished = fake_step(s)
    assert bad.status is RequestStatus.FINISHED_ERROR and where in bad.error
    assert ([r.request_id for r in out.failed] == ["bad"]) == (fail_on == 1)
    assert bad in finished or fail_on == 1  # failed during the update: reported with the finished
    assert set(s.requests) == {"a", "b"} and s.kv.block_ids("bad") == []
    assert [r.num_output_tokens for r in (s.requests["a"], s.requests["b"])] == [1, 1]
    while s.requests:
        fake_step(s)
    assert s.kv.num_free_blocks == 16


@pytest.mark.parametrize("bad", [{"max_num_seqs": 0}, {"max_num_batched_tokens": 0}, {"batch_min_share": 1.0},
                                 {"long_prefill_token_threshold": -1}, {"step_budget_tokens": -1},
                                 {"min_chunk_tokens": 0}, {"step_time_budget_s": 0.0}, {"max_num_seq": 4}])
def test_scheduler_config_refuses_bad_values_and_is_frozen(bad):
    with pytest.raises(ValueError):
        SchedulerConfig(**bad)
    cfg = SchedulerConfig()
    with pytest.raises(ValueError):
        cfg.max_num_seqs = 2
