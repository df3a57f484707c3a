"""The run's configuration: typed, validated once, and saved verbatim with the results.

A result file is only comparable with another if it says exactly what load and
data produced it, so the whole configuration (and how token counts were made)
goes into the JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from llmserve.bench.client import EndpointConfig
from llmserve.bench.metrics import SLO

DatasetName = Literal["random", "shared-prefix", "multi-turn", "input-grounded", "jsonl"]
DATASET_NAMES: tuple[str, ...] = ("random", "shared-prefix", "multi-turn", "input-grounded", "jsonl")


@dataclass(slots=True)
class DatasetConfig:
    name: DatasetName = "random"
    path: str | None = None
    tokenizer: str | None = None
    output_len: int = 128  # every dataset but random (which has its own)
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    num_prefixes: int = 10
    prefix_len: int = 512
    question_len: int = 32
    turns: int = 4
    turn_user_len: int = 64
    grounded_input_len: int = 512
    grounded_task: str = "rewrite"
    batch_share: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in DATASET_NAMES:
            raise ValueError(f"dataset must be one of {DATASET_NAMES}, got {self.name!r}")
        if self.name == "jsonl" and not self.path:
            raise ValueError("the jsonl dataset needs --dataset-path")
        for name in ("output_len", "random_input_len", "random_output_len", "num_prefixes", "turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prefix_len", "question_len", "turn_user_len", "grounded_input_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.random_range_ratio < 1:
            raise ValueError(f"random range ratio must be in [0, 1), got {self.random_range_ratio}")
        if not 0 <= self.batch_share <= 1:
            raise ValueError(f"batch share must be in [0, 1], got {self.batch_share}")


@dataclass(slots=True)
class LoadConfig:
    num_prompts: int = 1000
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    rate_trace: str | None = None
    num_warmups: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"num prompts must be >= 1, got {self.num_prompts}")
        if not self.request_rate > 0:
            raise ValueError(f"request rate must be > 0 (inf: all at once), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max concurrency must be >= 1, got {self.max_concurrency}")
        if self.num_warmups < 0:
            raise ValueError(f"num warmups must be >= 0, got {self.num_warmups}")


@dataclass(slots=True)
class BenchConfig:
    endpoint: EndpointConfig
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    percentiles: tuple[float, ...] = (90.0, 99.0)
    slo: SLO = field(default_factory=SLO)
    save_result: str | None = None
    plot: str | None = None
    show_progress: bool = True
    label: str | None = None
    server_metrics: str | None = None  # None: off; "": the base URL's /metrics

    def __post_init__(self) -> None:
        for p in self.percentiles:
            if not 0 < p <= 100:
                raise ValueError(f"percentiles must be in (0, 100], got {p}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: infinite rates become the string ``"inf"``; the API key is left out."""
        d = asdict(self)
        d["endpoint"].pop("api_key", None)
        d["endpoint"]["url"] = self.endpoint.url
        d["slo"] = self.slo.to_dict()
        d["load"]["request_rate"] = _json_float(self.load.request_rate)
        d["load"]["burstiness"] = _json_float(self.load.burstiness)
        return d


def _json_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else x
