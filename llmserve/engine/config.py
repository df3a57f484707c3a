"""Engine configuration: one typed object, validated once, passed down."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from llmserve.engine.kv_budget import default_kv_bytes

DTYPES = ("auto", "fp32", "bf16", "int8", "w8a8")
KV_CACHE_DTYPES = ("auto", "fp32", "fp16")
_KV_ALIASES = {"auto": "auto", "fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16",
               "half": "fp16"}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "auto": "auto", "bfloat16": "bf16",
                  "fp32": "fp32", "bf16": "bf16", "int8": "int8", "w8a8": "w8a8"}


@dataclass(slots=True)
class SpeculativeConfig:
    """vLLM-style ``speculative_config``."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    # Stop speculating for a request whose recent acceptance rate falls below this
    # (at batch 1) ...
    min_acceptance: float = 0.25
    # ... plus this much per other decoding request: verifying draft tokens costs
    # more as the batch grows, so a guess must be likelier to pay for itself.
    acceptance_slope: float = 0.05
    # Skip speculation when this many requests are decoding (compute-bound already).
    max_batch_for_spec: int = 16
    # Each request's draft length adapts: it grows by 2 after a fully accepted draft,
    # up to this, and falls to (accepted + 1) after a rejection. Long verbatim copies
    # then get long drafts, while text that rarely matches pays for one guess at a
    # time. None: 2 x num_speculative_tokens for n-gram (a guess costs nothing to
    # make), num_speculative_tokens for a draft model (each guess is a forward pass).
    max_speculative_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft"):
            raise ValueError(f"speculative method must be 'ngram' or 'draft', got {self.method!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.method == "draft" and not self.model:
            raise ValueError("draft speculation needs 'model'")
        if self.max_speculative_tokens is None:
            k = self.num_speculative_tokens
            self.max_speculative_tokens = 2 * k if self.method == "ngram" else k
        if self.max_speculative_tokens < self.num_speculative_tokens:
            raise ValueError("max_speculative_tokens must be at least num_speculative_tokens")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | "SpeculativeConfig" | None) -> "SpeculativeConfig | None":
        if d is None or isinstance(d, SpeculativeConfig):
            return d
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown speculative_config keys: {sorted(unknown)}")
        return cls(**d)


@dataclass(slots=True)
class EngineConfig:
    model: str = "SmolLM2-135M-Instruct"
    # auto: int8 where the weights came from a block-quantised GGUF (nothing to lose) and
    # the int8 kernel runs here, fp32 otherwise. Resolved by EngineCore.
    dtype: str = "auto"
    # The KV pool's element type. auto: fp16 with int8 weights (half the bytes each decode
    # step's attention streams, twice the tokens per GiB; within the int8 tolerance), fp32
    # otherwise (fp32 weights stay token-exact against transformers).
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None  # used when num_kv_blocks is not given
    # Engines sharing this machine: the default KV pool takes its share of the free memory.
    instances: int = 1
    # int8 weights: the issue-7 path (fp32 weights kept for prefill GEMM, two-byte activations
    # in decode steps) instead of the kernel on every row with one-byte activations where
    # quality holds (benchmarks/results/activation_quality.md); ~0.5 GB more for SmolLM2.
    exact_activations: bool = False
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    seed: int | None = None
    threads: int | None = None
    batch_min_share: float = 0.1
    long_prefill_token_threshold: int = 0  # cap on a prompt chunk per step; 0: none
    # A step with prompt tokens lasts about as long as an idle prefill of this many
    # tokens (measured online; SchedulerConfig says how); 0: token budgets only.
    step_budget_tokens: int = 48
    step_time_budget_s: float | None = None  # that time outright, overriding the above
    speculative_config: SpeculativeConfig | dict | None = None
    model_store: str | None = None
    served_model_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = _DTYPE_ALIASES.get(str(self.dtype).lower())
        if d is None:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        self.dtype = d
        kv = _KV_ALIASES.get(str(self.kv_cache_dtype).lower())
        if kv is None:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        self.kv_cache_dtype = kv
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be at least 1")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if self.instances < 1:
            raise ValueError("instances must be at least 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def num_blocks_for(self, kv_bytes_per_token: int, max_model_len: int, available: int | None = None) -> int:
        """Blocks in the pool: explicit, from a memory budget, or enough for a full batch.

        The default (no count, no budget) sizes the pool for ``max_num_seqs`` requests
        of 1/4 context each, at most this instance's share of the ``available`` memory
        (``kv_budget``), at least one full context.
        """
        bs = self.block_size
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        if self.kv_cache_memory_bytes is not None:
            n = self.kv_cache_memory_bytes // (kv_bytes_per_token * bs)
            if n < 1:
                raise ValueError("kv_cache_memory_bytes is smaller than one KV block")
            return int(n)
        want_tokens = max(max_model_len, self.max_num_seqs * max_model_len // 4)
        cap_tokens = max(max_model_len, default_kv_bytes(available, self.instances) // kv_bytes_per_token)
        return max(1, -(-min(want_tokens, cap_tokens) // bs))
