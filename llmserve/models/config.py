"""The architecture description of a decoder-only model, whatever file it came from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

HIDDEN_ACTS = ("silu", "gelu_tanh", "gelu")
LAYER_TYPES = ("full_attention", "sliding_attention")
# The fields that are Llama's defaults unless a family sets them (families.py fills them).
ARCH_FIELDS = ("family", "hidden_act", "norm_offset", "qkv_bias", "qk_norm", "sandwich_norm", "embed_scale",
               "attn_scale", "attn_softcap", "logit_softcap", "partial_rotary_factor", "sliding_window",
               "layer_types", "rope_local_theta")


@dataclass(slots=True)
class ModelConfig:
    """Shapes, constants and parts of one decoder.

    Field names follow Hugging Face's ``LlamaConfig`` so a ``config.json`` maps
    onto it directly; the GGUF loader fills the same fields from GGUF metadata.
    The fields after ``quantized_source`` choose the parts in which the supported
    families differ from Llama (``llmserve.models.families`` maps each family's
    config onto them).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    name: str = "model"
    # The weights were decoded from <= 8-bit blocks of 32 or 256 (GGUF Q4_x / Q5_x /
    # Q8_0 / k-quants): the int8 weight format holds them (nearly) as they are.
    quantized_source: bool = False
    family: str = "llama"
    hidden_act: str = "silu"  # the MLP's gate: SwiGLU (silu) or GeGLU (gelu_tanh, gelu)
    norm_offset: float = 0.0  # Gemma stores RMSNorm weights as w and scales by 1 + w
    qkv_bias: bool = False  # Qwen2: biases on q, k and v
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head of q and k before RoPE
    sandwich_norm: bool = False  # Gemma 2/3: norms after attention and after the MLP too
    embed_scale: float = 1.0  # Gemma: embeddings times sqrt(hidden_size)
    attn_scale: float = 0.0  # 0: head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma 2: cap * tanh(score / cap)
    logit_softcap: float | None = None  # Gemma 2: the same on the output logits
    partial_rotary_factor: float = 1.0  # Phi-4-mini: RoPE on the first share of each head
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included
    layer_types: list[str] = field(default_factory=list)  # per layer, LAYER_TYPES; empty: all full
    rope_local_theta: float | None = None  # sliding layers' RoPE base (Gemma 3); None: rope_theta
    # What generation_config.json recommends for omitted sampling fields (generation_defaults.py)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim <= 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.attn_scale <= 0:
            self.attn_scale = self.head_dim ** -0.5
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        elif self.eos_token_id is None:
            self.eos_token_id = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("model config: num_attention_heads must be a multiple of num_key_value_heads")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"model config: hidden_act {self.hidden_act!r} is not one of {HIDDEN_ACTS}")
        self.layer_types = list(self.layer_types or [])
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"model config: {len(self.layer_types)} layer_types for {self.num_hidden_layers} layers")
        if bad := sorted(set(self.layer_types) - set(LAYER_TYPES)):
            raise ValueError(f"model config: unknown layer types {bad} (known: {LAYER_TYPES})")
        if "sliding_attention" in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError("model config: sliding layers need a positive sliding_window")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise ValueError(f"model config: partial_rotary_factor {self.partial_rotary_factor} "
                             f"gives an odd or empty rotary dim of head dim {self.head_dim}")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def window(self, layer: int) -> int | None:
        """The sliding window of one layer, or None when it attends to the whole context."""
        sliding = self.layer_types[layer] == "sliding_attention" if self.layer_types else False
        return self.sliding_window if sliding else None

    @property
    def max_window(self) -> int | None:
        """The widest window over all layers: None when some layer sees everything."""
        windows = [self.window(i) for i in range(self.num_hidden_layers)]
        return None if None in windows else max(windows)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "model") -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dictionary of a supported family."""
        from llmserve.models.families import arch_from_hf

        arch = d.get("llmserve_arch") or arch_from_hf(d)  # first: another family's config has other keys
        eos = d.get("eos_token_id")
        params = d.get("rope_parameters") or {}
        fields: dict[str, Any] = dict(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            head_dim=int(d.get("head_dim") or 0),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=float(d.get("rope_theta") or params.get("rope_theta") or 10000.0),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=[eos] if isinstance(eos, int) else list(eos or []),
            name=name,
            quantized_source=bool(d.get("llmserve_quantized_source", False)),
        )
        return cls(**{**fields, **arch})

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face ``config.json`` dictionary for this model (a ``LlamaConfig`` plus our
        ``llmserve_arch`` fields). ``from_hf_dict(to_hf_dict())`` round-trips every field except ``name``."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id),
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
            "llmserve_quantized_source": self.quantized_source,
            "llmserve_arch": {**{k: asdict(self)[k] for k in ARCH_FIELDS}, "rope_scaling": self.rope_scaling},
        }

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes
