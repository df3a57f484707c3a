"""The encoding between the API process and the engine process: msgpack, data only.

Nothing on the wire can execute (no pickle): a request travels as its token ids,
its sampling parameters as a field dict and a few scalars; an output as nested
lists. Both ends run the same code, so positional lists are enough and cheap.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import msgpack

from llmserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from llmserve.engine.request import Request
from llmserve.engine.sampling_params import SamplingParams, StructuredOutputsParams

_SP_FIELDS = tuple(f.name for f in fields(SamplingParams))


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    # strict_map_key off: snapshot dicts may be keyed by ints (priorities).
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# ---- requests ---------------------------------------------------------------------------
def encode_request(req: Request, prompt_text: str | None) -> list:
    sp = req.sampling_params
    fields_ = {k: getattr(sp, k) for k in _SP_FIELDS}
    if sp.structured_outputs is not None:  # the constraint as data; the engine compiles it
        fields_["structured_outputs"] = asdict(sp.structured_outputs)
    return [req.request_id, req.prompt_token_ids, fields_,
            req.max_tokens, req.arrival_time, req.priority, req.cache_salt, sorted(req.eos_token_ids),
            prompt_text, req.output_token_ids, req.trace, req.lora_name]  # (output: a resumed stream's)


def decode_request(m: list) -> tuple[Request, str | None]:
    rid, ids, sp, max_tokens, arrival, prio, salt, eos, text, out, trace, lora = m
    if sp.get("structured_outputs") is not None:
        sp["structured_outputs"] = StructuredOutputsParams(**sp["structured_outputs"])
    req = Request(rid, ids, SamplingParams(**sp), max_tokens, arrival_time=arrival, priority=prio,
                  cache_salt=salt, eos_token_ids=frozenset(eos), all_token_ids=ids + out, trace=trace,
                  lora_name=lora)
    return req, text


# ---- outputs ------------------------------------------------------------------------------
def _lps(lps: list[TokenLogprob] | None) -> list | None:
    return None if lps is None else [[t.token_id, t.logprob, [list(x) for x in t.top]] for t in lps]


def _unlps(m: list | None) -> list[TokenLogprob] | None:
    return None if m is None else [TokenLogprob(t, lp, [tuple(x) for x in top]) for t, lp, top in m]


def encode_output(o: RequestOutput) -> list:
    c = o.outputs[0]  # the engine core makes one sequence per request (n fans out above it)
    m = o.metrics
    met = None if m is None else [m.arrival_time, m.first_scheduled_time, m.first_token_time,
                                  m.last_token_time, m.finished_time]
    # The prompt ids are sent once, with the final output; the API side keeps its own.
    return [o.request_id, o.finished, c.delta_text, c.delta_token_ids, _lps(c.delta_logprobs),
            c.text, c.token_ids, c.finish_reason, c.stop_reason, _lps(c.logprobs),
            o.num_cached_tokens, met, o.error, o.spans]


def decode_output(m: list, prompt_token_ids: list[int], prompt: str | None) -> RequestOutput:
    (rid, finished, dtext, dids, dlps, text, ids, reason, stop_reason, lps, cached, met, error, spans) = m
    comp = CompletionOutput(0, text, ids, reason, stop_reason, _unlps(lps), dtext, dids, _unlps(dlps))
    metrics = None if met is None else RequestMetrics(*met)
    return RequestOutput(rid, prompt_token_ids, [comp], finished, prompt, cached, metrics, error, spans)
