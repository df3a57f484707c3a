"""Priority classes on a real (tiny) model: realtime first, batch never lost."""

from __future__ import annotations

from llmserve.engine.sampling_params import SamplingParams


def test_realtime_served_first_under_batch_saturation(tiny):
    eng = tiny.engine(max_num_seqs=3, max_num_batched_tokens=16, num_kv_blocks=64, block_size=8)
    long = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i in range(5):
        eng.add_request(f"batch{i}", [10 + i] * 12, long, priority="batch")
    finished: list[str] = []
    steps = 0
    first_token_step = {}
    while eng.has_unfinished():
        if steps == 6:
            eng.add_request("rt", [7, 8, 9], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
                            priority="realtime")
        for out in eng.step():
            first_token_step.setdefault(out.request_id, steps)
            if out.finished:
                finished.append(out.request_id)
        steps += 1
    assert first_token_step["rt"] == 6  # admitted at once: a batch request gave up its slot
    assert finished.index("rt") == 0
    assert sorted(finished) == sorted(["rt"] + [f"batch{i}" for i in range(5)])
    assert eng.scheduler.num_preemptions >= 1
    assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_integer_priorities_order_admission(tiny):
    eng = tiny.engine(max_num_seqs=1, num_kv_blocks=64)
    sp = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    for rid, prio in (("p5", 5), ("p2", 2), ("p9", 9), ("p-1", -1)):
        eng.add_request(rid, [1, 2, 3], sp, priority=prio)
    order = []
    while eng.has_unfinished():
        order += [o.request_id for o in eng.step() if o.finished]
    assert order == ["p-1", "p2", "p5", "p9"]
