"""Build :class:`PoolSignals` from what a gateway sees: requests and load reports.

The live gateway and the simulator feed the same collector the same events
(a request arrived, its first token came back, it finished) and the instances'
load reports, so both hand the policies numbers measured the same way. Time is
always passed in; nothing here reads a clock.

Arrival tokens per second is the arrival count times the mean tokens per
request (prompt plus output, both smoothed over recent requests). The output
length of a request is unknown when it arrives, so its mean has to stand in;
the prompt's actual length is known, but summing actual prompt lengths makes
the rate jump with every long prompt, while what fills an instance's batch
seats is how many requests arrive and how long they hold a seat (mostly
decode), which the mean describes better.

Arrivals carry their priority class: batch-class ones are counted apart
(``batch_arrival_*``), their latencies stay out of the percentiles (the SLO is
realtime's), and whoever runs the batches (the gateway's batch runner, the
simulator's backlog) tells :meth:`SignalCollector.set_batch_need` the lines per
second their completion windows require, which the snapshot prices at the mean
request: policies size for realtime demand plus that need only.

One set of defaults for every caller (the live controller, the simulator, the
fidelity check): :data:`OUTPUT_TOKENS_PRIOR` stands in for the mean output
length until the first request finishes, and :func:`estimate_prompt_tokens`
turns a prompt's characters into tokens. The gateway does not tokenize (it would
need each model's tokenizer on the request path), so live prompts are counted
as characters / :data:`CHARS_PER_TOKEN`. The simulator knows each prompt's
exact tokens, but it feeds the policy the same estimate, from the characters
the live gateway would see for that prompt: the policy must see the demand the
live one would, including the estimate's error on text that is not 4
characters a token, or the simulator predicts a different controller.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Mapping, Protocol

from llmserve.autoscale.saturation import modelled_capacity
from llmserve.autoscale.signals import PoolSignals
from llmserve.autoscale.window import SampleWindow
from llmserve.lifecycle import InstanceState
from llmserve.percentiles import percentiles

SIGNAL_WINDOW_S = 10.0  # arrival rates
LATENCY_WINDOW_S = 30.0  # TTFT and e2e percentiles: longer, a p99 needs samples
OUTPUT_TOKENS_PRIOR = 128.0  # mean output tokens assumed until a request finishes
CHARS_PER_TOKEN = 4.0  # characters of prompt text per token, for the estimate


def estimate_prompt_tokens(chars: float, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """The prompt tokens a policy is told of, from the prompt's characters (at least 1)."""
    return max(1, round(chars / chars_per_token))


class InstanceLoad(Protocol):
    """The load-report fields the signals use (``llmserve.load_report.LoadReport`` has them)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    busy_fraction: float
    tokens_per_s: float
    max_num_seqs: int
    # optional: ``step_costs`` (base_s, prefill_token_s, decode_seq_s), the engine's fitted step model,
    # and ``threads``, the torch threads it was fitted on


class SignalCollector:
    """Sliding windows over gateway events, turned into one snapshot per tick.

    ``window_s`` covers arrival rates; ``latency_window_s`` covers the TTFT and
    e2e percentiles (longer, because a p99 needs samples). ``start`` is when
    recording began (default: the first snapshot).
    """

    def __init__(self, window_s: float = SIGNAL_WINDOW_S, latency_window_s: float = LATENCY_WINDOW_S,
                 output_tokens_prior: float = OUTPUT_TOKENS_PRIOR, output_tokens_tau: int = 200,
                 start: float | None = None) -> None:
        if window_s <= 0 or latency_window_s <= 0:
            raise ValueError("signal collector: windows must be positive")
        if output_tokens_tau < 1:
            raise ValueError("signal collector: output_tokens_tau must be >= 1")
        self.window_s = window_s
        self.latency_window_s = latency_window_s
        self.mean_output_tokens = output_tokens_prior
        self.mean_prompt_tokens = 0.0
        self._tau = output_tokens_tau
        self._n_prompts = self._n_outputs = 0
        self._start = start
        self._arrivals: deque[float] = deque()
        self._batch_arrivals: deque[float] = deque()
        self.batch_need_lines_per_s = 0.0
        self._ttft = SampleWindow()
        self._e2e = SampleWindow()

    def set_batch_need(self, lines_per_s: float) -> None:
        """The batch lines per second the active batches' windows require (0: none)."""
        self.batch_need_lines_per_s = max(lines_per_s, 0.0)

    def record_arrival(self, t: float, prompt_tokens: int, batch: bool = False) -> None:
        self._arrivals.append(t)
        if batch:
            self._batch_arrivals.append(t)
        self._n_prompts += 1
        self.mean_prompt_tokens += (prompt_tokens - self.mean_prompt_tokens) / min(self._n_prompts, self._tau)

    def record_first_token(self, t: float, ttft_s: float, batch: bool = False) -> None:
        if batch:
            return
        self._ttft.append(t, ttft_s)

    def record_finish(self, t: float, e2e_s: float, output_tokens: int, batch: bool = False) -> None:
        if not batch:
            self._e2e.append(t, e2e_s)
        # A plain average until ``tau`` samples, an EWMA after: the prior only
        # stands in until the first request finishes, not for ``tau`` requests.
        self._n_outputs += 1
        self.mean_output_tokens += (output_tokens - self.mean_output_tokens) / min(self._n_outputs, self._tau)

    def snapshot(self, now: float, loads: Iterable[InstanceLoad], queue_depth: Mapping[str, int],
                 counts: Mapping[InstanceState, int], dispatched: int = 0,
                 batch_dispatched: int = 0) -> PoolSignals:
        """The signals at ``now``; ``loads`` are the ready instances' latest reports,
        ``dispatched`` the requests the gateway has in flight to instances
        (``batch_dispatched`` of them batch class)."""
        since = now - self.window_s
        for arrivals in (self._arrivals, self._batch_arrivals):
            while arrivals and arrivals[0] <= since:
                arrivals.popleft()
        self._ttft.prune(now - self.latency_window_s)
        self._e2e.prune(now - self.latency_window_s)
        n_arr, n_batch = len(self._arrivals), len(self._batch_arrivals)
        per_request = self.mean_prompt_tokens + self.mean_output_tokens
        if self._start is None:
            self._start = now
        # Right after start the window is not full yet: divide by what has elapsed.
        span = min(self.window_s, now - self._start) if now > self._start else self.window_s
        ttft_p50, ttft_p99 = percentiles(self._ttft.values(), (50, 99))
        e2e_p50, e2e_p99 = percentiles(self._e2e.values(), (50, 99))

        loads = list(loads)
        k = len(loads)
        busy = kv = fill = tput = model = 0.0
        waiting = running = seats = modelled = 0
        by_threads: dict[int, list[float]] = {}
        for r in loads:
            costs = getattr(r, "step_costs", None)  # (an upstream without an engine model has none)
            if costs is not None and r.max_num_seqs > 0:
                one = modelled_capacity(costs.base_s, costs.prefill_token_s, costs.decode_seq_s, r.max_num_seqs,
                                        self.mean_prompt_tokens, self.mean_output_tokens)
                model += one
                modelled += 1
                if getattr(r, "threads", None):
                    by_threads.setdefault(r.threads, []).append(one)
            waiting += r.num_waiting
            running += r.num_running
            busy += r.busy_fraction
            kv += r.kv_cache_usage
            fill += r.num_running / r.max_num_seqs if r.max_num_seqs > 0 else 0.0
            seats += max(r.max_num_seqs, 0)
            tput += r.tokens_per_s
        d = max(k, 1)
        return PoolSignals(
            now=now,
            window_s=self.window_s,
            arrival_rate=n_arr / span,
            arrival_tokens_per_s=n_arr * per_request / span,
            batch_arrival_rate=n_batch / span,
            batch_arrival_tokens_per_s=n_batch * per_request / span,
            batch_need_tokens_per_s=self.batch_need_lines_per_s * per_request,
            batch_dispatched=batch_dispatched,
            queue_depth=dict(queue_depth),
            waiting=waiting,
            running=running,
            dispatched=dispatched,
            ttft_p50=ttft_p50,
            ttft_p99=ttft_p99,
            e2e_p50=e2e_p50,
            e2e_p99=e2e_p99,
            busy_fraction=busy / d,
            kv_usage=kv / d,
            batch_fill=fill / d,
            seats_per_instance=seats / d,
            throughput_per_instance=tput / d,
            modelled_capacity=model / modelled if modelled else 0.0,
            modelled_by_threads=tuple((t, sum(v) / len(v)) for t, v in sorted(by_threads.items())),
            ready=counts.get(InstanceState.READY, 0),
            warming=counts.get(InstanceState.WARMING, 0),
            starting=counts.get(InstanceState.STARTING, 0),
            # A stopping instance is on its way out like a draining one: neither is capacity.
            draining=counts.get(InstanceState.DRAINING, 0) + counts.get(InstanceState.STOPPING, 0),
        )
