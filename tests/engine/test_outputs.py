"""What ``EngineCore.step`` hands out per request: deltas on every output, the whole
sequence only on the final one (so an output queued for a slow reader holds a step's
tokens, never a copy of all of them)."""

from __future__ import annotations

from llmserve.engine.sampling_params import SamplingParams


def test_intermediate_outputs_carry_deltas_and_the_final_one_the_whole_sequence(tiny):
    engine = tiny.engine(max_num_seqs=4)
    engine.add_request("r", [1, 2, 3, 4], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                         logprobs=2))
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == "r"]
    *steps, final = outs
    assert steps and final.finished and not any(o.finished for o in steps)
    for o in steps:
        c = o.outputs[0]
        assert c.token_ids == [] and c.text == "" and c.logprobs is None and c.finish_reason is None
        assert len(c.delta_token_ids) == len(c.delta_logprobs) >= 1
    c = final.outputs[0]
    deltas = [t for o in outs for t in o.outputs[0].delta_token_ids]
    assert c.token_ids == deltas and len(deltas) == 12 and c.finish_reason == "length"
    assert [lp.token_id for lp in c.logprobs] == deltas
    assert [lp.token_id for o in outs for lp in o.outputs[0].delta_logprobs] == deltas
