"""The output processor on its own: text, stop strings, failures and what it reports
ended, with a real Request and a letter-per-token detokeniser (no model, no scheduler)."""

from __future__ import annotations

from llmserve.engine.output_processor import OutputProcessor
from llmserve.engine.request import Request, RequestStatus
from llmserve.engine.sampler import StepSamples
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from llmserve.engine.stats import EngineStats


class _Letters:
    """Token t is the letter chr(97 + t); ``fail_at``: the token id whose decoding raises."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at

    def add(self, ids):
        if self.fail_at in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return "".join(chr(97 + t) for t in ids)

    def finish(self):
        return ""


class _Tokenizer:
    def __init__(self, fail_prompt: list[int] | None = None) -> None:
        self.fail_prompt = fail_prompt

    def detokenizer(self, prompt_ids, skip_special_tokens):
        return _Letters(fail_at=25 if list(prompt_ids) == self.fail_prompt else None)


def _start(proc: OutputProcessor, rid: str, prompt: list[int], **params) -> Request:
    req = Request(rid, prompt, SamplingParams(**params), params.get("max_tokens", 16))
    req.status = RequestStatus.RUNNING
    proc.add(proc.new_state(req, None))
    return req


def _step(proc: OutputProcessor, tokens: dict[Request, int], finished: set[str] = frozenset()):
    plan, samples = SchedulerOutput(), StepSamples()
    for req, t in tokens.items():
        req.all_token_ids.append(t)
        plan.scheduled.append(ScheduledRequest(req, 1, [], True))
        samples.tokens[req.request_id] = [t]
    outputs: list = []
    ended = proc.process(plan, samples, set(finished), 1.0, outputs)
    return {o.request_id: o for o in outputs}, ended


def test_a_stop_string_ends_the_request_and_is_reported_not_applied():
    proc = OutputProcessor(_Tokenizer(), EngineStats())
    req = _start(proc, "a", [1], stop=["cd"], max_tokens=16)
    other = _start(proc, "b", [2], max_tokens=16)
    out, ended = _step(proc, {req: 0, other: 0})  # "a": held back, it could start "cd"
    assert ended == {} and out["a"].outputs[0].delta_text == ""
    out, ended = _step(proc, {req: 2, other: 1})  # "ac": only the "c" is held back now
    assert ended == {} and out["a"].outputs[0].delta_text == "a"
    out, ended = _step(proc, {req: 3, other: 2})  # "acd"
    assert ended == {"a": None}  # the processor says so; the scheduler is the engine's to tell
    assert req.status is RequestStatus.RUNNING
    final = out["a"]
    assert final.finished and final.text == "a" and final.finish_reason == "stop"
    assert final.outputs[0].stop_reason == "cd" and final.outputs[0].delta_text == ""
    assert not out["b"].finished and out["b"].outputs[0].delta_text == "c"
    assert "a" not in proc and "b" in proc


def test_a_request_the_scheduler_finished_is_not_reported_again():
    proc = OutputProcessor(_Tokenizer(), EngineStats())
    req = _start(proc, "a", [1], stop=["b"], max_tokens=1)
    req.status = RequestStatus.FINISHED_LENGTH
    out, ended = _step(proc, {req: 1}, finished={"a"})  # the stop string came with the last token
    assert ended == {} and out["a"].finished and out["a"].finish_reason == "stop" and out["a"].text == ""


def test_a_failing_detokeniser_fails_its_request_alone():
    proc = OutputProcessor(_Tokenizer(fail_prompt=[9]), EngineStats())
    bad = _start(proc, "bad", [9])
    good = _start(proc, "good", [1])
    out, ended = _step(proc, {bad: 25, good: 25})
    assert set(ended) == {"bad"} and "detokenisation failed" in ended["bad"]
    assert out["bad"].finished and out["bad"].finish_reason == "error" and out["bad"].error == ended["bad"]
    assert not out["good"].finished and out["good"].outputs[0].delta_text == "z"
    assert "bad" not in proc and "good" in proc


def test_a_request_failed_in_sampling_gets_its_error_output():
    proc = OutputProcessor(None, EngineStats())
    req = _start(proc, "a", [1])
    req.status, req.error = RequestStatus.FINISHED_ERROR, "sampling failed: nan"
    out, ended = _step(proc, {req: 3})
    assert ended == {}  # the scheduler failed it already
    assert out["a"].error == "sampling failed: nan" and out["a"].finish_reason == "error"


def test_abort_and_drop():
    stats = EngineStats()
    proc = OutputProcessor(None, stats)
    _start(proc, "a", [1])
    _start(proc, "b", [1])
    out = proc.abort("a")
    assert out.finished and out.finish_reason == "abort" and stats.finished == {"abort": 1}
    assert proc.abort("a") is None
    proc.drop("b")
    assert len(proc) == 0 and stats.finished == {"abort": 1}
