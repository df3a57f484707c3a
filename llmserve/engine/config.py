"""Engine configuration: one typed, frozen object, validated once, passed down.

The command line is generated from these fields (``llmserve/flags.py``): a field's
description is its ``--help``, its default the flag's default.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from llmserve.engine.kv_budget import default_kv_bytes
from llmserve.flags import Flag, byte_size

DTYPES = ("auto", "fp32", "bf16", "int8", "w8a8")
KV_CACHE_DTYPES = ("auto", "fp32", "fp16")
_KV_ALIASES = {"auto": "auto", "fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16",
               "half": "fp16"}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "auto": "auto", "bfloat16": "bf16",
                  "fp32": "fp32", "bf16": "bf16", "int8": "int8", "w8a8": "w8a8"}

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _alias(table: dict[str, str]):
    """A flag's type: vLLM's names (``bfloat16``, ``half``) as ours, before argparse checks the choices."""
    return lambda v: table.get(v.lower(), v)


class SpeculativeConfig(BaseModel):
    """vLLM-style ``speculative_config``."""

    model_config = _FROZEN

    method: str = "ngram"
    num_speculative_tokens: int = Field(4, ge=1)
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    # Each request's draft length follows its measured acceptance and what a draft row
    # costs in this step (spec_policy.py): up to max_speculative_tokens, none where it does
    # not pay. False: always num_speculative_tokens (where the proposer finds that many).
    adaptive: bool = True
    # The longest draft a request gets. None: 2 x num_speculative_tokens for n-gram (a
    # guess costs nothing to make), num_speculative_tokens for a draft model (each guess
    # is a forward pass).
    max_speculative_tokens: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_max(cls, d: Any) -> Any:
        if isinstance(d, dict) and d.get("max_speculative_tokens") is None:
            k = d.get("num_speculative_tokens", 4)
            d = {**d, "max_speculative_tokens": 2 * k if d.get("method", "ngram") == "ngram" else k}
        return d

    @model_validator(mode="after")
    def _check(self) -> "SpeculativeConfig":
        if self.method not in ("ngram", "draft"):
            raise ValueError(f"speculative method must be 'ngram' or 'draft', got {self.method!r}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.method == "draft" and not self.model:
            raise ValueError("draft speculation needs 'model'")
        if self.max_speculative_tokens < self.num_speculative_tokens:
            raise ValueError("max_speculative_tokens must be at least num_speculative_tokens")
        return self


def parse_speculative(text: str) -> dict[str, Any] | None:
    """The ``--speculative-config`` flag: JSON, or ``none`` for no speculation."""
    return None if text.strip().lower() in ("none", "null", "off") else json.loads(text)


class EngineConfig(BaseModel):
    """The engine's settings, named as in ``vllm serve`` where the concept is the same."""

    model_config = _FROZEN

    model: str = Field("SmolLM2-135M-Instruct", description="model store name, .gguf file or Hugging Face folder")
    model_store: str | None = Field(None, description="model store folder (LLMSERVE_MODEL_STORE sets the default)")
    dtype: Annotated[str, Flag(choices=DTYPES, type=_alias(_DTYPE_ALIASES))] = Field(
        "auto", description="weight format: int8 = int8 weights, fp32 activations; w8a8 = int8 activations "
                            "too (torch's dynamic int8; lossy on SmolLM2); auto = int8 for a block-quantised "
                            "GGUF where the int8 kernel runs, else fp32")
    kv_cache_dtype: Annotated[str, Flag(choices=KV_CACHE_DTYPES, type=_alias(_KV_ALIASES))] = Field(
        "auto", description="KV pool element type; auto = fp16 with int8 weights (half the bytes each decode "
                            "step's attention streams), else fp32 (token-exact against transformers)")
    max_num_seqs: int = Field(64, ge=1, description="requests in the running batch at most")
    max_num_batched_tokens: int = Field(512, ge=1, description="tokens in one step at most")
    max_model_len: int | None = Field(None, ge=1, description="context length (default: the model's)")
    block_size: int = Field(16, ge=1, description="tokens per KV block")
    num_kv_blocks: int | None = Field(None, ge=1, description="KV pool size in blocks")
    kv_cache_memory_bytes: Annotated[int | None, Flag(name="--kv-cache-memory", type=str, parse=byte_size)] = Field(
        None, gt=0, description="KV pool budget: bytes, or 512M, 2G, 1.5GiB (used when --num-kv-blocks is not given)")
    instances: int = Field(1, ge=1, description="engines sharing this machine: the default KV pool takes its "
                                                "share of the free memory, and threads their share of the cores")
    # int8 weights: the issue-7 path (fp32 weights kept for prefill GEMM, two-byte activations
    # in decode steps) instead of the kernel on every row with one-byte activations where
    # quality holds (benchmarks/results/activation_quality.md); ~0.5 GB more for SmolLM2.
    exact_activations: bool = Field(
        False, description="int8 weights: two-byte activations everywhere and fp32 prefill (greedy equal to "
                           "fp32 on 8 of 8 test chats, benchmarks/int8_quality.py), instead of one-byte activations on the layer kinds where quality holds")
    # Where prefill rows go with int8 weights: fp32 GEMM on each layer's codes unpacked into one
    # reused buffer (the same bits as fp32 copies for a GGUF source), on kept fp32 copies, or
    # our kernel like decode rows. Which of unpack and int8 is faster depends on the CPU's
    # integer throughput, so auto times both when the engine starts (models/prefill_path.py).
    prefill_weights: Annotated[Literal["auto", "unpack", "fp32", "int8"],
                               Flag(choices=("auto", "unpack", "fp32", "int8"))] = Field(
        "auto", description="int8 weights: prefill rows through the faster on this CPU of unpack and int8, "
                            "timed at start (auto, default); fp32 GEMM on weights unpacked a layer at a time "
                            "(unpack); on kept fp32 copies (fp32, ~0.55 GB more for SmolLM2); or the int8 "
                            "kernel like decode rows (int8)")
    enable_prefix_caching: bool = Field(True, description="reuse the KV blocks of shared prompt prefixes")
    # On by default: prompt lookup costs next to nothing when it finds no match, and each
    # request's draft length follows what its drafts earn (spec_policy.py), down to none.
    speculative_config: Annotated[SpeculativeConfig | None, Flag(type=parse_speculative)] = Field(
        default_factory=SpeculativeConfig, description='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": '
                                                       '4}\'; none turns speculation off')
    seed: int | None = Field(None, description="seeds the engine's sampler")
    threads: int | None = Field(None, ge=1, description="torch CPU threads for this instance's steps "
                                "(default: its share of the machine's cores)")
    batch_min_share: float = Field(0.1, ge=0.0, lt=1.0, description="share of each step's budget batch requests always get")
    long_prefill_token_threshold: int = Field(
        0, ge=0, description="cap on a prompt chunk per step (0: none); small values bound realtime TTFT under long prompts")
    # A step with prompt tokens lasts about as long as an idle prefill of this many
    # tokens (measured online; SchedulerConfig says how); 0: token budgets only.
    step_budget_tokens: int = Field(
        48, ge=0, description="a step with prompt tokens lasts about as long as an idle prefill of this many tokens "
                        "(measured on this machine as it runs); 0: token budgets only")
    step_time_budget_s: Annotated[float | None, Flag(name="--step-time-budget-ms", scale=1e-3)] = Field(
        None, gt=0.0, description="that step time outright, in ms (overrides --step-budget-tokens)")
    # LoRA adapters, in vLLM's flags (docs/lora.md); --lora-modules implies --enable-lora.
    enable_lora: bool = Field(False, description="serve LoRA adapters (loaded with --lora-modules or "
                                                 "POST /v1/load_lora_adapter)")
    lora_modules: Annotated[dict[str, str], Flag(nargs="+", type=str, metavar="NAME=PATH")] = Field(
        default_factory=dict, description="adapters served as models: a PEFT folder or a GGUF LoRA each")
    max_loras: int = Field(4, ge=1, description="LoRA adapters resident at once (one step mixes at most these)")
    max_lora_rank: int = Field(16, ge=1, le=512, description="largest LoRA rank accepted")
    lora_dtype: Annotated[str, Flag(choices=KV_CACHE_DTYPES, type=_alias(_KV_ALIASES))] = Field(
        "auto", description="the LoRA factors' storage; auto = fp16 with int8 weights where the C++ kernel "
                            "runs (half the memory and the bytes each step reads), else fp32 (token-exact "
                            "against PEFT)")
    max_cpu_loras: int | None = Field(None, ge=1, description="adapters kept loaded in memory beyond the "
                                                              "resident ones, least recently used out (default: --max-loras)")
    # Set by the server from its own --served-model-name.
    served_model_name: Annotated[str | None, Flag(skip=True)] = None

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v: Any) -> str:
        d = _DTYPE_ALIASES.get(str(v).lower())
        if d is None:
            raise ValueError(f"dtype must be one of {DTYPES}, got {v!r}")
        return d

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _lora_modules(cls, v: Any) -> Any:
        if not isinstance(v, (list, tuple)):
            return v
        out: dict[str, str] = {}
        for item in v:
            name, eq, path = str(item).partition("=")
            if not eq or not name or not path:
                raise ValueError(f"lora_modules: {item!r} is not NAME=PATH")
            if name in out:
                raise ValueError(f"lora_modules: the name {name!r} is given twice")
            out[name] = path
        return out

    @property
    def lora_enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_modules)

    @field_validator("kv_cache_dtype", "lora_dtype", mode="before")
    @classmethod
    def _storage_dtype(cls, v: Any, info: ValidationInfo) -> str:
        kv = _KV_ALIASES.get(str(v).lower())
        if kv is None:
            raise ValueError(f"{info.field_name} must be one of {KV_CACHE_DTYPES}, got {v!r}")
        return kv

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

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
                from llmserve.models.errors import FlagError

                raise FlagError(f"--kv-cache-memory: {self.kv_cache_memory_bytes} bytes is smaller than one "
                                f"KV block ({kv_bytes_per_token * bs} bytes)")
            return int(n)
        want_tokens = max(max_model_len, self.max_num_seqs * max_model_len // 4)
        cap_tokens = max(max_model_len, default_kv_bytes(available, self.instances) // kv_bytes_per_token)
        return max(1, -(-min(want_tokens, cap_tokens) // bs))
