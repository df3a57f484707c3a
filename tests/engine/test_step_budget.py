"""Time-aware prompt chunks: pure scheduler tests with given step costs (no clock)."""

from __future__ import annotations

from llmserve.engine.request import BATCH, REALTIME
from llmserve.engine.step_cost import StepCostModel, StepCosts
from tests.engine.test_scheduler import make, req

# 10 ms per step, 1 ms per prompt token, 0.5 ms per decode, attention 0.5 ms/token per 1k context
COSTS = StepCosts(base_s=0.010, prefill_token_s=0.001, decode_seq_s=0.0005, context_s=0.0005)


def step(s, costs=COSTS):
    """One planned step and what it costs (measured before the update moves the counts)."""
    out = s.schedule(costs)
    secs = seconds(out, costs)
    s.update_from_output(out, {x.request.request_id: [7] for x in out.scheduled if x.sample})
    return out, secs


def seconds(out, costs=COSTS) -> float:
    decodes = [x for x in out.scheduled if x.request.num_computed_tokens == x.request.num_tokens - 1]
    pre = [x for x in out.scheduled if x not in decodes]
    return costs.base_s + len(decodes) * costs.decode_seq_s + sum(
        costs.prefill(x.num_tokens, x.request.num_computed_tokens) for x in pre)


def test_a_chunk_is_sized_so_the_step_stays_under_the_budget_with_decodes_and_depth():
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, max_num_batched_tokens=2048,
             step_budget_tokens=100)
    budget = s.time_budget(COSTS)
    assert budget == COSTS.step(100, 0)
    for i in range(20):
        s.add_request(req(f"d{i}", 4, max_tokens=500, t=i, first=1000 + 10 * i))
    step(s)  # the 20 short prompts: one step
    s.add_request(req("long", 3000, max_tokens=1, priority=BATCH, t=100))
    sizes = []
    while "long" in s.requests and s.requests["long"].num_computed_tokens < 3000:
        out, secs = step(s)
        chunk = {x.request.request_id: x.num_tokens for x in out.scheduled}["long"]
        sizes.append(chunk)
        assert secs <= budget + 1e-9
    assert sum(sizes) == 3000
    # 20 decodes share every step, and deeper chunks attend to more context: they shrink
    assert sizes[0] < 100 and sizes[-2] < sizes[0]


def test_a_realtime_arrival_is_not_held_behind_a_long_chunk():
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, max_num_batched_tokens=512)
    s.add_request(req("batch", 2000, max_tokens=4, priority=BATCH, t=0))
    first, first_s = step(s)
    assert first_s <= s.time_budget(COSTS) + 1e-9 and first.total_tokens < 512
    s.add_request(req("rt", 80, max_tokens=4, priority=REALTIME, t=1, first=5000))
    out, _ = step(s)
    got = {x.request.request_id: x.num_tokens for x in out.scheduled}
    assert got == {"rt": 80}  # its whole prompt, no batch chunk beside it
    # what it waited for (the step in flight) was no longer than its own idle prefill + 20%
    assert first_s <= 1.2 * COSTS.step(80, 0)


def test_without_costs_or_with_the_knob_off_token_budgets_rule():
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, max_num_batched_tokens=512)
    s.add_request(req("a", 2000, t=0))
    assert s.schedule(None).scheduled[0].num_tokens == 512
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, max_num_batched_tokens=512, step_budget_tokens=0)
    s.add_request(req("a", 2000, t=0))
    assert s.schedule(COSTS).scheduled[0].num_tokens == 512
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, max_num_batched_tokens=512,
             step_time_budget_s=0.060, long_prefill_token_threshold=30)
    s.add_request(req("a", 2000, t=0))
    assert s.schedule(COSTS).scheduled[0].num_tokens == 30  # vLLM's cap still applies


def test_a_chunk_never_falls_below_the_minimum():
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, step_time_budget_s=0.001, min_chunk_tokens=16)
    s.add_request(req("a", 200, priority=BATCH, t=0))
    assert s.schedule(COSTS).scheduled[0].num_tokens == 16


def test_a_long_realtime_prompt_is_split_to_the_budget_only_while_streams_decode():
    """Once admitted and alone, a long prompt takes the token budget's chunks (nobody waits on
    its steps; cut to the time budget, an 8k-token prompt ran 7x slower); an arrival gets its
    prompt in beside the next chunk, and while it decodes, chunks fit the time budget again."""
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, max_num_batched_tokens=512, step_budget_tokens=48)
    s.add_request(req("long", 3000, max_tokens=1, t=0))
    sizes = [step(s)[0].scheduled[0].num_tokens for _ in range(3)]
    assert sizes[0] <= 48 and sizes[1:] == [512, 512]  # (waiting, it was cut like any)
    s.add_request(req("chat", 4, max_tokens=1000, t=1, first=9000))
    for decoding in (False, True):
        out, secs = step(s)
        got = {x.request.request_id: x.num_tokens for x in out.scheduled}
        assert got["chat"] == (1 if decoding else 4) and got["long"] < 48
        assert secs <= s.time_budget(COSTS) + (1e-9 if decoding else COSTS.prefill(4, 0))  # (a short prompt: whole)
    while "long" in s.requests:  # to its last chunk: a long prompt's tail is no short prompt
        out, secs = step(s)
        assert secs <= s.time_budget(COSTS) + 1e-9 and "chat" in s.requests


def test_the_cost_model_learns_each_part_from_its_own_steps():
    truth = StepCosts(base_s=0.020, prefill_token_s=0.0003, decode_seq_s=0.0008, context_s=0.0001)
    m = StepCostModel(prior=StepCosts(base_s=0.010, prefill_token_s=0.0006, decode_seq_s=0.0004,
                                      context_s=0.0002))
    for i in range(200):
        d = 1 + i % 30
        m.observe(0, d, 0, truth.step(0, d))
        m.observe(128, d, 256, truth.step(128, d, 256))
    got = m.costs()
    assert abs(got.step(0, 16) - truth.step(0, 16)) < 0.05 * truth.step(0, 16)
    assert abs(got.prefill(128, 256) - truth.prefill(128, 256)) < 0.1 * truth.prefill(128, 256)
    for _ in range(3):
        m.observe(0, 4, 0, 30.0)  # a descheduled step cannot blow the fit up
    assert m.costs().base_s < 0.1
    assert m.costs().tokens_within(m.costs().prefill(500, 100), 100) in (499, 500)


def test_decodes_that_fill_the_budget_still_leave_prompts_half_of_it():
    s = make(num_blocks=2048, block_size=16, max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=2048,
             step_budget_tokens=100)
    for i in range(250):  # 250 decodes: 135 ms, over the 110 ms budget
        s.add_request(req(f"d{i}", 4, max_tokens=50, t=i, first=1000 + 10 * i))
    step(s)
    s.add_request(req("p", 500, t=1000, first=9000))
    out, _ = step(s)
    got = {x.request.request_id: x.num_tokens for x in out.scheduled}["p"]
    assert got == COSTS.tokens_within((s.time_budget(COSTS) - COSTS.base_s) / 2, 0)


def test_a_short_realtime_prompt_is_not_split_but_a_batch_one_is():
    s = make(num_blocks=1024, block_size=16, max_model_len=4096, max_num_batched_tokens=512, step_budget_tokens=48)
    s.add_request(req("rt", 150, t=0))
    s.add_request(req("b", 150, priority=BATCH, t=1, first=5000))
    out, _ = step(s)
    got = {x.request.request_id: x.num_tokens for x in out.scheduled}
    assert got == {"rt": 150}  # whole (and no batch chunk beside a realtime prefill)
    out, _ = step(s)
    got = {x.request.request_id: x.num_tokens for x in out.scheduled}
    assert got["b"] < 48


def test_draft_rows_count_in_the_fit_and_scale_with_the_machine():
    """Steps that verify drafts are costed with their draft rows (a slower machine: all parts slower)."""
    prior = StepCosts()
    truth = StepCosts(base_s=2 * prior.base_s, decode_seq_s=2 * prior.decode_seq_s, draft_row_s=2 * prior.draft_row_s)
    m = StepCostModel(prior=prior)
    for i in range(200):
        d, k = 1 + i % 8, 5 * (i % 3)
        m.observe(0, d, 0, truth.step(0, d, draft_rows=k), draft_rows=k)
    got = m.costs()
    assert abs(got.draft_row_s - truth.draft_row_s) < 0.05 * truth.draft_row_s
    assert abs(got.step(0, 4, draft_rows=10) - truth.step(0, 4, draft_rows=10)) < 0.05 * truth.step(0, 4, draft_rows=10)
    # without the draft rows in the fit, the same steps would read as a slower machine
    blind = StepCostModel(prior=prior)
    for i in range(200):
        d, k = 1 + i % 8, 5 * (i % 3)
        blind.observe(0, d, 0, truth.step(0, d, draft_rows=k))
    assert blind.costs().base_s > 1.2 * got.base_s
