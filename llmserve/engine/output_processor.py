"""Per-request text state: detokenisation, stop strings, logprobs, metrics, and the
``RequestOutput``s built from them.

The processor never calls the scheduler. ``process`` returns the requests it ended
itself (a stop string, or their text failed); the engine tells the scheduler. A
request whose text raises is failed alone: its output carries the error, the other
requests of the step go on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from llmserve.engine.request import Request, RequestStatus
from llmserve.engine.trace_spans import request_spans

if TYPE_CHECKING:
    from llmserve.engine.sampler import StepSamples
    from llmserve.engine.scheduler import SchedulerOutput
    from llmserve.engine.stats import EngineStats

log = logging.getLogger(__name__)

# Request id -> None when a stop string ended it, else why its text failed.
Ended = dict[str, str | None]


@dataclass
class RequestState:
    """One request's text beside the scheduler's token state."""

    request: Request
    detok: Any
    prompt: str | None
    metrics: RequestMetrics
    text: str = ""
    emitted: int = 0  # chars of text already handed out
    num_tokens_emitted: int = 0
    logprobs: list[TokenLogprob] | None = None
    hold_back: int = 0  # chars kept back while they could still be the start of a stop string
    stop_from: int = 0  # a stop string must end past this many chars (the first min_tokens tokens' text)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None

    @classmethod
    def start(cls, req: Request, detok: Any, prompt: str | None) -> "RequestState":
        """The state of a request with no output handed out yet."""
        sp = req.sampling_params
        return cls(req, detok, prompt, RequestMetrics(req.arrival_time),
                   logprobs=[] if sp.logprobs is not None else None,
                   hold_back=max((len(s) for s in sp.stop), default=1) - 1)


class OutputProcessor:
    """Owns every unfinished request's ``RequestState``; ``tokenizer`` None: token ids only."""

    def __init__(self, tokenizer: Any | None, stats: EngineStats) -> None:
        self.tokenizer = tokenizer
        self.stats = stats
        self._states: dict[str, RequestState] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def new_state(self, req: Request, prompt: str | None) -> RequestState:
        """The state of a new request, kept only once ``add`` is called (so that a request
        the scheduler refuses leaves nothing here)."""
        detok = None
        if self.tokenizer is not None and req.sampling_params.detokenize:
            detok = self.tokenizer.detokenizer(req.prompt_token_ids, req.sampling_params.skip_special_tokens)
        return RequestState.start(req, detok, prompt)

    def add(self, state: RequestState) -> None:
        self._states[state.request.request_id] = state

    # ---- the step ----------------------------------------------------------------------
    def on_scheduled(self, plan: SchedulerOutput, now: float) -> None:
        for s in plan.scheduled:
            st = self._states[s.request.request_id]
            if st.metrics.first_scheduled_time is None:
                st.metrics.first_scheduled_time = now
                self.stats.on_first_scheduled(s.request, now)

    def process(self, plan: SchedulerOutput, samples: StepSamples, finished: set[str], now: float,
                outputs: list[RequestOutput]) -> Ended:
        """Append the output of every request the step touched to ``outputs``; ``finished``:
        the requests the scheduler ended this step. Returns those this processor ended."""
        ended: Ended = {}
        for s in plan.scheduled:
            req = s.request
            st = self._states.get(req.request_id)
            if st is None:
                continue
            if req.status is RequestStatus.FINISHED_ERROR:
                outputs.append(self._fail(st, req.error, now))
            elif req.request_id in samples.tokens:
                lps = samples.logprobs.get(req.request_id, [])
                try:
                    outputs.append(self._advance(st, lps, now, req.request_id in finished, ended))
                except Exception as e:  # noqa: BLE001 - its detokeniser or stop check: it fails alone
                    outputs.append(self._fail(st, f"detokenisation failed: {e}", now))
                    ended[req.request_id] = st.error
        return ended

    def fail(self, request_id: str, error: str | None, now: float) -> RequestOutput | None:
        """End one request with an error (the scheduler has failed it, or is told to)."""
        st = self._states.get(request_id)
        return None if st is None else self._fail(st, error, now)

    def abort(self, request_id: str) -> RequestOutput | None:
        st = self._states.pop(request_id, None)
        if st is None:
            return None
        st.finish_reason = "abort"
        st.metrics.finished_time = time.monotonic()
        self.stats.on_finished(st.request, "abort", st.metrics)
        return self._output(st, finished=True)

    def drop(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    # ---- one request -------------------------------------------------------------------
    def _advance(self, st: RequestState, lps: list[TokenLogprob], now: float, finished: bool,
                 ended: Ended) -> RequestOutput:
        req = st.request
        new_ids = req.output_token_ids[st.num_tokens_emitted:]
        if st.metrics.first_token_time is None:
            st.metrics.first_token_time = now
            self.stats.on_first_token(req, now)
        self.stats.on_tokens(req, len(new_ids), now)
        st.metrics.last_token_time = now
        if st.logprobs is not None:
            st.logprobs.extend(lps[:len(new_ids)])
        if st.detok is not None:
            visible = new_ids
            sp = req.sampling_params
            if (finished and req.status is RequestStatus.FINISHED_STOPPED and new_ids
                    and not sp.include_stop_str_in_output
                    and (new_ids[-1] in req.eos_token_ids or new_ids[-1] in sp.stop_token_ids)):
                visible = new_ids[:-1]  # the stop token itself is not text, unless asked for (as vLLM v1)
            exempt = sp.min_tokens - (req.num_output_tokens - len(new_ids))  # of these, still under min_tokens
            if exempt > 0:  # their text is fed apart, to know where it ends
                st.text += st.detok.add(visible[:exempt])
                st.stop_from, visible = len(st.text), visible[exempt:]
            st.text += st.detok.add(visible)
            if finished:
                st.text += st.detok.finish()
            if self._find_stop(st) is not None and not finished:
                ended[req.request_id] = None
                finished = True
        if finished:
            st.finish_reason = st.finish_reason or req.status.finish_reason
            if st.stop_reason is None:
                st.stop_reason = req.stop_reason
            st.metrics.finished_time = now
            self._states.pop(req.request_id, None)
            self.stats.on_finished(req, st.finish_reason, st.metrics)
        return self._output(st, finished)

    @staticmethod
    def _find_stop(st: RequestState) -> str | None:
        """The earliest stop string in the new text; cuts the text there."""
        sp = st.request.sampling_params
        if not sp.stop:
            return None
        search_from = max(0, st.emitted - st.hold_back)
        best = None
        for s in sp.stop:
            # vLLM's min_tokens rule: a stop string ending in the first min_tokens tokens' text does not count
            i = st.text.find(s, max(search_from, st.stop_from - len(s) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        st.text = st.text[:i + len(s)] if sp.include_stop_str_in_output else st.text[:i]
        st.finish_reason, st.stop_reason = "stop", s
        return s

    def _fail(self, st: RequestState, error: str | None, now: float) -> RequestOutput:
        req = st.request
        st.error = error or "the request failed"
        log.warning("request %s failed: %s", req.request_id, st.error)
        st.finish_reason, st.stop_reason = "error", None
        st.metrics.finished_time = now
        self._states.pop(req.request_id, None)
        self.stats.on_finished(req, "error", st.metrics)
        return self._output(st, finished=True)

    @staticmethod
    def _output(st: RequestState, finished: bool) -> RequestOutput:
        req = st.request
        ids = req.output_token_ids
        emit_upto = len(st.text) if finished else max(st.emitted, len(st.text) - st.hold_back)
        delta = st.text[st.emitted:emit_upto]
        st.emitted = emit_upto
        new_ids = ids[st.num_tokens_emitted:]
        lp_delta = None
        if st.logprobs is not None:
            lp_delta = st.logprobs[st.num_tokens_emitted:len(ids)]
        st.num_tokens_emitted = len(ids)
        if finished:
            comp = CompletionOutput(0, st.text, list(ids), st.finish_reason, st.stop_reason, st.logprobs,
                                    delta, new_ids, lp_delta)
        else:  # deltas only: a copy of the whole sequence per step is quadratic for a queued stream
            comp = CompletionOutput(0, "", [], None, None, None, delta, new_ids, lp_delta)
        spans = request_spans(req, st.finish_reason, st.metrics) if finished and req.trace else None
        return RequestOutput(req.request_id, req.prompt_token_ids, [comp], finished, st.prompt,
                             req.num_cached_tokens, st.metrics, st.error if finished else None, spans)
