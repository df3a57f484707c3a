"""The architecture description of a Llama-family model, whatever file it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _scaling_from_rope_parameters(params: Any) -> dict[str, Any] | None:
    """transformers 5 writes ``rope_parameters`` (theta and scaling together) instead of ``rope_scaling``."""
    if not isinstance(params, dict) or params.get("rope_type", "default") == "default":
        return None
    return {k: v for k, v in params.items() if k != "rope_theta"}


@dataclass(slots=True)
class ModelConfig:
    """Shapes and constants of a Llama-family decoder.

    Field names follow Hugging Face's ``LlamaConfig`` so a ``config.json`` maps
    onto it directly; the GGUF loader fills the same fields from GGUF metadata.
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

    def __post_init__(self) -> None:
        if self.head_dim <= 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
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

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "model") -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dictionary."""
        eos = d.get("eos_token_id")
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            head_dim=int(d.get("head_dim") or 0),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=float(d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta") or 10000.0),
            rope_scaling=d.get("rope_scaling") or _scaling_from_rope_parameters(d.get("rope_parameters")),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=[eos] if isinstance(eos, int) else list(eos or []),
            name=name,
            quantized_source=bool(d.get("llmserve_quantized_source", False)),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face ``config.json`` dictionary (a ``LlamaConfig``) for this model.

        ``from_hf_dict(to_hf_dict())`` round-trips every field except ``name``.
        """
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
        }

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes
