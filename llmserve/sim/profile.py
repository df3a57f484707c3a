"""How fast one engine instance runs: the step-time model and its JSON format.

A continuous-batching engine runs one forward pass (a step) over whatever the
scheduler put in the batch. Its duration is modelled as linear in what the step
holds::

    t = a + b * prefill_tokens + c * decode_seqs + d * sum_context

``a`` is the fixed cost of a pass (weights read once per step, launch overhead),
``b`` the compute per prompt token, ``c`` the per-sequence cost of a decode
(sampling, the LM head), ``d`` attention over the KV cache (memory read per
token of context). The coefficients are fitted from measurements of the real
engine (:mod:`llmserve.sim.calibrate`) or given for an accelerator.

Profile JSON::

    {"name": "h100-8b", "step": {"base_s": .., "per_prefill_token_s": ..,
     "per_decode_seq_s": .., "per_context_token_s": ..},
     "max_num_seqs": 128, "max_num_batched_tokens": 4096,
     "kv_capacity_tokens": 400000, "cold_start_s": 120, "warmup_s": 10,
     "request_overhead_s": 0.05, "sharing": {"cores": 2, "threads": 1, "api_share": 0.2},
     "source": "what the numbers come from"}

``request_overhead_s`` is latency a client sees outside the engine's steps
(gateway, HTTP, tokenising, the first SSE event); ``sharing`` slows every step
while several instances on one machine are busy (:mod:`llmserve.sim.sharing`).
Both are optional and fitted through the HTTP path
(:mod:`llmserve.sim.http_calibration`); without them an instance is the engine
alone with a core to itself.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from llmserve.sim.sharing import CoreSharing

BUILTIN_PROFILES = ("cpu-smollm2", "h100-8b")
DEFAULT_PROFILE = "cpu-smollm2"


@dataclass(frozen=True, slots=True)
class StepModel:
    """Coefficients of the linear step-time model (seconds)."""

    base_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float

    def __post_init__(self) -> None:
        for name in ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"step model: {name} must be >= 0, got {getattr(self, name)}")
        if self.base_s <= 0 and self.per_decode_seq_s <= 0:
            raise ValueError("step model: a step must take time (base_s or per_decode_seq_s > 0)")

    def step_time(self, prefill_tokens: int, decode_seqs: int, sum_context: int) -> float:
        return (self.base_s + self.per_prefill_token_s * prefill_tokens
                + self.per_decode_seq_s * decode_seqs + self.per_context_token_s * sum_context)


@dataclass(frozen=True, slots=True)
class InstanceProfile:
    """One instance type: step timing, batch limits, KV capacity and cold start."""

    name: str
    step: StepModel
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    kv_capacity_tokens: int = 1 << 20
    cold_start_s: float = 60.0
    warmup_s: float = 5.0
    request_overhead_s: float = 0.0
    sharing: CoreSharing | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"profile {self.name}: max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"profile {self.name}: max_num_batched_tokens must be >= max_num_seqs "
                             "(every running sequence decodes one token per step)")
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"profile {self.name}: kv_capacity_tokens must be >= 1")
        if not 0 <= self.warmup_s <= self.cold_start_s:
            raise ValueError(f"profile {self.name}: need 0 <= warmup_s <= cold_start_s")
        if self.request_overhead_s < 0:
            raise ValueError(f"profile {self.name}: request_overhead_s must be >= 0")

    def with_cold_start(self, cold_start_s: float) -> "InstanceProfile":
        """The same instance with another cold start (warm-up keeps its share)."""
        if cold_start_s < 0:
            raise ValueError("cold start must be >= 0")
        share = self.warmup_s / self.cold_start_s if self.cold_start_s > 0 else 0.0
        return replace(self, cold_start_s=cold_start_s, warmup_s=cold_start_s * share)

    def saturation_tokens_per_s(self, prompt_tokens: float, output_tokens: float) -> float:
        """Throughput (prompt + output tokens/s) with a full batch of average requests.

        A steady-state estimate for sizing and for the predictive policy's prior:
        each step decodes ``max_num_seqs`` sequences at half their final context
        and carries the prefill share that keeps arrivals balanced with departures.
        """
        n = self.max_num_seqs
        s = self.step
        ctx = n * (prompt_tokens + output_tokens / 2)
        decode_step = s.base_s + s.per_decode_seq_s * n + s.per_context_token_s * ctx
        # Per request: output_tokens decode steps shared by n, plus its prefill.
        per_request = output_tokens * decode_step / n + prompt_tokens * (
            s.per_prefill_token_s + s.per_context_token_s * prompt_tokens / 2)
        return (prompt_tokens + output_tokens) / per_request

    def to_json(self) -> str:
        d = asdict(self)
        for key in ("extra", "sharing", "request_overhead_s"):
            if not d[key]:
                d.pop(key)  # absent: the engine alone, as profiles without them always were
        return json.dumps(d, indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InstanceProfile":
        d = dict(d)
        known = {"name", "step", "max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens",
                 "cold_start_s", "warmup_s", "request_overhead_s", "sharing", "source", "extra"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"profile: unknown keys {sorted(unknown)}")
        if "step" not in d or "name" not in d:
            raise ValueError("profile: needs 'name' and 'step'")
        d["step"] = StepModel(**d["step"])
        if d.get("sharing") is not None:
            d["sharing"] = CoreSharing(**d["sharing"])
        return cls(**d)


def load_profile(name_or_path: str) -> InstanceProfile:
    """A built-in profile by name, or a profile JSON file by path."""
    if name_or_path in BUILTIN_PROFILES:
        text = resources.files("llmserve.sim").joinpath("profiles", f"{name_or_path}.json").read_text()
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"unknown profile {name_or_path!r}: use one of {BUILTIN_PROFILES} or a JSON file")
        text = path.read_text()
    return InstanceProfile.from_dict(json.loads(text))


def save_profile(profile: InstanceProfile, path: str | Path) -> None:
    Path(path).write_text(profile.to_json())
