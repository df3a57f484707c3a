"""The run's configuration: typed, validated once, and saved verbatim with the results.

A result file is only comparable with another if it says exactly what load and
data produced it, so the whole configuration (and how token counts were made)
goes into the JSON.

The models are also the command line: ``llmserve bench``'s flags (named as in
``vllm bench serve``) are generated from their fields (:mod:`llmserve.flags`), so a
flag's name, default and help are written here once.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmserve.bench.client import EndpointConfig
from llmserve.bench.datasets import GROUNDED_INSTRUCTIONS
from llmserve.bench.metrics import LATENCY_METRICS, SLO
from llmserve.flags import Flag

DatasetName = Literal["random", "shared-prefix", "multi-turn", "input-grounded", "jsonl", "sharegpt"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DatasetConfig(_Frozen):
    name: Annotated[DatasetName, Flag(name="--dataset-name")] = "random"
    path: Annotated[str | None, Flag(name="--dataset-path")] = Field(
        None, description="jsonl prompts, a ShareGPT JSON file, or the source text for input-grounded")
    tokenizer: str | None = Field(
        None, description="the model's tokenizer (HF folder or .gguf file) for exact token counts")
    output_len: int = Field(128, ge=1, description="max_tokens for shared-prefix, multi-turn, input-grounded "
                            "and jsonl")  # random has its own
    random_input_len: int = Field(1024, ge=1, description="random: prompt tokens")
    random_output_len: int = Field(128, ge=1, description="random: max_tokens")
    random_range_ratio: float = Field(0.0, ge=0.0, lt=1.0,
                                      description="random: each length uniform in [len*(1-r), len*(1+r)]")
    num_prefixes: int = Field(10, ge=1, description="shared-prefix: distinct system prompts")
    prefix_len: int = Field(512, ge=0, description="shared-prefix: tokens per system prompt")
    question_len: int = Field(32, ge=0, description="shared-prefix: tokens per question")
    turns: int = Field(4, ge=1, description="multi-turn: turns per conversation")
    turn_user_len: int = Field(64, ge=0, description="multi-turn: tokens per user turn")
    grounded_input_len: int = Field(512, ge=0, description="input-grounded: passage tokens")
    grounded_task: Annotated[str, Flag(choices=tuple(sorted(GROUNDED_INSTRUCTIONS)))] = "rewrite"
    sharegpt_output_len: int | None = Field(None, ge=1, description="sharegpt: max_tokens (default: each "
                                            "conversation's answer's length)")
    batch_share: float = Field(0.0, ge=0.0, le=1.0, description='share of requests sent with "priority": "batch"')

    @field_validator("grounded_task")
    @classmethod
    def _task(cls, task: str) -> str:
        if task not in GROUNDED_INSTRUCTIONS:
            raise ValueError(f"grounded task must be one of {sorted(GROUNDED_INSTRUCTIONS)}, got {task!r}")
        return task

    @model_validator(mode="after")
    def _path(self) -> DatasetConfig:
        if self.name in ("jsonl", "sharegpt") and not self.path:
            raise ValueError(f"the {self.name} dataset needs --dataset-path")
        return self


class LoadConfig(_Frozen):
    num_prompts: int = Field(1000, ge=1)
    request_rate: float = Field(math.inf, gt=0.0, description="requests/s; inf sends all at once, "
                                "else Poisson/gamma arrivals")
    burstiness: float = Field(1.0, gt=0.0, description="gamma shape of the gaps: 1 Poisson, <1 burstier, "
                              ">1 more regular")
    max_concurrency: int | None = Field(None, ge=1, description="most requests in flight at once")
    rate_trace: Annotated[str | None, Flag(metavar="CSV")] = Field(
        None, description="rate over time (rows 'time_s,rate', linear between rows); replaces --request-rate")
    num_warmups: int = Field(0, ge=0, description="requests sent first and not counted")
    seed: int = 0


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ValueError(f"--metric-percentiles {text!r}: expected comma-separated numbers") from None


def _metrics(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in names if m not in LATENCY_METRICS]
    if bad or not names:
        raise ValueError(f"--percentile-metrics {text!r}: a comma-separated list of {','.join(LATENCY_METRICS)}")
    return names


class BenchConfig(_Frozen):
    endpoint: EndpointConfig
    dataset: DatasetConfig = DatasetConfig()
    load: LoadConfig = LoadConfig()
    percentiles: Annotated[tuple[Annotated[float, Field(gt=0.0, le=100.0)], ...], Flag(
        name="--metric-percentiles", type=str, parse=_percentiles, metavar="METRIC_PERCENTILES",
        show=lambda ps: ",".join(f"{p:g}" for p in ps))] = Field(
        (90.0, 99.0), description="comma-separated, e.g. 50,90,99,99.9")
    percentile_metrics: Annotated[tuple[str, ...], Flag(
        name="--percentile-metrics", type=str, parse=_metrics, metavar="METRICS",
        show=lambda ms: ",".join(ms))] = Field(LATENCY_METRICS, description="the latencies the table shows")
    slo: Annotated[SLO, Flag(name="--goodput", nargs="+", type=str, parse=SLO.parse, metavar="KEY:MS",
                             show=lambda slo: " ".join(f"{k}:{v:g}" for k, v in slo.to_dict().items()))] = Field(
        default_factory=SLO, description="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000")
    save_result: Annotated[str | None, Flag(nargs="?", const="", metavar="FILE")] = Field(
        None, description="write config, requests and summary as JSON (bare, as vLLM's: see --result-dir)")
    plot: Annotated[str | None, Flag(nargs="?", const="", metavar="PNG")] = Field(
        None, description="write a PNG (default: beside --save-result, else bench.png)")
    show_progress: Annotated[bool, Flag(name="--disable-tqdm", negate=True)] = Field(
        True, description="no progress bar")
    label: str | None = Field(None, description="a name for this run in results and comparisons")
    # None: off; "": the base URL's /metrics.
    server_metrics: Annotated[str | None, Flag(nargs="?", const="", metavar="URL")] = Field(
        None, description="read the server's /metrics counters before and after the run and show them "
        "beside the bench's counts (default URL: the base URL's /metrics)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: infinite rates become the string ``"inf"``; the API key is left out."""
        d = self.model_dump()
        d["endpoint"].pop("api_key", None)
        d["endpoint"]["url"] = self.endpoint.url
        d["slo"] = self.slo.to_dict()
        d["load"]["request_rate"] = _json_float(self.load.request_rate)
        d["load"]["burstiness"] = _json_float(self.load.burstiness)
        return d


def _json_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else x
