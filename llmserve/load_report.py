"""The ``/load`` report: what an instance says about its own load.

Every llmserve engine instance answers ``GET /load`` with a :class:`LoadReport`
(see ``docs/load-report.md``); the gateway's balancer and admission and the
autoscaler read it. Upstreams that have no ``/load`` (vLLM, SGLang, llama.cpp's
server) are read through their Prometheus ``/metrics`` text instead:
:class:`MetricsLoadParser` turns that text into the same report.

No torch here: the gateway imports this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmserve.lifecycle import InstanceState


class StepCostsReport(BaseModel):
    """Seconds per step part, fitted online to the engine's own steps (``engine/step_cost.py``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    base_s: float = Field(ge=0.0)
    prefill_token_s: float = Field(ge=0.0)
    decode_seq_s: float = Field(ge=0.0)


class LoadReport(BaseModel):
    """One instance's load snapshot, exactly the fields of ``docs/load-report.md``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: str
    model: str
    ready: bool
    draining: bool
    # The engine's lifecycle state; None from an upstream that does not say (an
    # older llmserve, or one read through /metrics). ``ready``/``draining`` stay for them.
    state: InstanceState | None = None
    num_running: int = Field(ge=0)
    num_waiting: int = Field(ge=0)
    num_waiting_by_priority: dict[str, int]
    kv_cache_usage: float = Field(ge=0.0, le=1.0)
    busy_fraction: float = Field(ge=0.0, le=1.0)
    tokens_per_s: float = Field(ge=0.0)
    generation_tokens_per_s: float = Field(ge=0.0)
    max_num_seqs: int = Field(ge=0)  # 0: unknown (an upstream read through /metrics)
    prefix_cache_hit_rate: float = Field(ge=0.0, le=1.0)
    timestamp: float
    # The engine's fitted step model (None: not measured yet, or an upstream that does not say).
    step_costs: StepCostsReport | None = None
    threads: int | None = Field(None, ge=1)  # the engine's torch threads (None: not said)
    # LoRA adapters resident now (a request on one runs without a load), and those kept
    # loaded in memory but in no slot (docs/lora.md)
    lora_adapters: list[str] = Field(default_factory=list)
    lora_adapters_loaded: list[str] = Field(default_factory=list)
    # every adapter the instance serves by name, evicted ones too (it reads those again itself)
    lora_adapters_registered: list[str] = Field(default_factory=list)

    @field_validator("state", mode="before")
    @classmethod
    def _state_word(cls, word: object) -> InstanceState | None:
        return InstanceState.from_wire(word)  # a word we do not know must not cost the report


# ---- Prometheus text ---------------------------------------------------------------

Sample = tuple[str, dict[str, str], float]


def parse_prometheus_text(text: str) -> list[Sample]:
    """Samples ``(name, labels, value)`` of a Prometheus text exposition, read with
    prometheus_client's own parser.

    A scrape is only advisory, so one bad line must not cost the whole report: the
    library stops at the first malformed line, and then the text is read again line
    by line, skipping the lines it refuses.
    """
    try:
        return _samples(text)
    except ValueError:
        pass
    samples: list[Sample] = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                samples += _samples(line)
            except ValueError:
                continue
    return samples


def _samples(text: str) -> list[Sample]:
    try:
        return [(s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(text) for s in family.samples]
    except (TypeError, IndexError, KeyError) as e:  # what else the parser raises on odd input
        raise ValueError(str(e)) from None


# ---- /metrics → LoadReport ---------------------------------------------------------

# Metric names per field, first match wins: vLLM (v1 and v0), SGLang, llama.cpp.
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs",
            "llamacpp:requests_processing")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs",
            "llamacpp:requests_deferred")
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
             "llamacpp:kv_cache_usage_ratio")
_PROMPT_TOKENS = ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total",
                  "llamacpp:prompt_tokens_total")
_GEN_TOKENS = ("vllm:generation_tokens_total", "sglang:generation_tokens_total",
               "llamacpp:tokens_predicted_total")
_PREFIX_QUERIES = ("vllm:prefix_cache_queries_total",)
_PREFIX_HITS = ("vllm:prefix_cache_hits_total",)
_PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")
_MODEL_LABELS = ("model_name", "model")


def _clamp01(x: float) -> float:
    return 0.0 if math.isnan(x) else min(1.0, max(0.0, x))


@dataclass
class MetricsLoadParser:
    """Builds :class:`LoadReport` s from successive ``/metrics`` scrapes of one upstream.

    Token rates come from counter differences between two scrapes, so the parser
    keeps the previous scrape's counters; otherwise it is a pure function of its
    input. Counts are summed over label sets (one per engine or model), ratios are
    averaged. Fields the upstream does not expose get neutral values
    (``max_num_seqs = 0`` means unknown; ``busy_fraction`` is estimated as 1 when
    anything runs, else 0).
    """

    instance_id: str
    model: str = ""
    _prev: tuple[float, float, float] | None = field(default=None, repr=False)

    def parse(self, text: str, now: float) -> LoadReport:
        by_name: dict[str, list[float]] = {}
        model = self.model
        for name, labels, value in parse_prometheus_text(text):
            by_name.setdefault(name, []).append(value)
            if not model:
                model = next((labels[k] for k in _MODEL_LABELS if k in labels), "")

        def total(names: tuple[str, ...]) -> float | None:
            for n in names:
                if n in by_name:
                    return sum(v for v in by_name[n] if not math.isnan(v))
            return None

        def mean(names: tuple[str, ...]) -> float | None:
            for n in names:
                if n in by_name:
                    vals = [v for v in by_name[n] if not math.isnan(v)]
                    return sum(vals) / len(vals) if vals else None
            return None

        running = int(total(_RUNNING) or 0)
        waiting = int(total(_WAITING) or 0)
        kv = mean(_KV_USAGE) or 0.0
        prompt, gen = total(_PROMPT_TOKENS) or 0.0, total(_GEN_TOKENS) or 0.0

        tokens_per_s = gen_per_s = 0.0
        if self._prev is not None:
            t0, p0, g0 = self._prev
            dt = now - t0
            # A counter that went down means the upstream restarted: no rate this time.
            if dt > 0 and prompt >= p0 and gen >= g0:
                tokens_per_s = (prompt - p0 + gen - g0) / dt
                gen_per_s = (gen - g0) / dt
        self._prev = (now, prompt, gen)

        queries, hits = total(_PREFIX_QUERIES), total(_PREFIX_HITS)
        if queries:
            hit_rate = (hits or 0.0) / queries
        else:
            hit_rate = mean(_PREFIX_HIT_RATE) or 0.0

        return LoadReport(
            instance_id=self.instance_id,
            model=model,
            ready=True,  # it answered; the gateway's /ready checks decide readiness
            draining=False,
            num_running=max(0, running),
            num_waiting=max(0, waiting),
            num_waiting_by_priority={},
            kv_cache_usage=_clamp01(kv),
            busy_fraction=1.0 if running > 0 else 0.0,
            tokens_per_s=max(0.0, tokens_per_s),
            generation_tokens_per_s=max(0.0, gen_per_s),
            max_num_seqs=0,
            prefix_cache_hit_rate=_clamp01(hit_rate),
            timestamp=now,
        )
