"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV pool.

Weights come in Hugging Face names and layout (see ``llmserve.models.loader``). The
model works on a flat batch of tokens ``[T]`` from many requests at once: matrix
products see no padding; only attention is grouped (``llmserve.models.attention``).
"""

from __future__ import annotations

import torch

from llmserve.models.attention import AttentionMetadata, paged_attention
from llmserve.models.config import ModelConfig
from llmserve.models.linear import LinearFactory, LinearLayer, dense_factory
from llmserve.models.ops import TorchOps, layer_ops
from llmserve.models.rope import RotaryEmbedding


def lazily_zeroed(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor whose pages the OS maps on first write, 4 KiB at a time.

    ``torch.zeros`` writes every byte up front: for a KV pool of a few GiB that is seconds
    of start-up and all of it resident. An anonymous mapping gets fresh zero pages from the
    kernel as blocks are written. Not numpy's zeros: numpy asks for transparent huge pages
    on large arrays, and then the first block written in each layer's region commits 2 MiB
    (a 2,048-token pool was wholly resident after one request).
    """
    import mmap

    itemsize = torch.empty((), dtype=dtype).element_size()
    count = 1
    for d in shape:
        count *= d
    nbytes = max(1, count * itemsize)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)  # where THP is "always"
    raw = torch.frombuffer(buf, dtype=torch.uint8)[:count * itemsize]  # the tensor keeps buf alive
    return raw.view(dtype).view(shape)


class _Layer:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], i: int, linear: LinearFactory) -> None:
        p = f"model.layers.{i}."
        # copies: a view would keep the whole memory-mapped weights file resident
        self.input_norm = w[p + "input_layernorm.weight"].float().clone()
        self.post_norm = w[p + "post_attention_layernorm.weight"].float().clone()
        self.qkv: LinearLayer = linear(torch.cat([w[p + "self_attn.q_proj.weight"],
                                                  w[p + "self_attn.k_proj.weight"],
                                                  w[p + "self_attn.v_proj.weight"]]))
        self.o: LinearLayer = linear(w[p + "self_attn.o_proj.weight"])
        self.gate_up: LinearLayer = linear(torch.cat([w[p + "mlp.gate_proj.weight"],
                                                      w[p + "mlp.up_proj.weight"]]))
        self.down: LinearLayer = linear(w[p + "mlp.down_proj.weight"])


LINEAR_KINDS = ("qkv", "o", "gate_up", "down", "head")


class LlamaForCausalLM:
    """Inference-only forward pass; holds no KV state of its own."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 linear: LinearFactory | None = None) -> None:
        linear = linear or dense_factory()
        self.config = config
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.eps = c.rms_norm_eps
        missing = [k for k in ("model.embed_tokens.weight", "model.norm.weight") if k not in weights]
        if missing:
            raise ValueError(f"model weights lack {missing}")
        self.embed = weights["model.embed_tokens.weight"].float()
        self.layers = [_Layer(c, weights, i, linear) for i in range(c.num_hidden_layers)]
        self.norm = weights["model.norm.weight"].float().clone()
        head = weights.get("lm_head.weight")
        if head is None or c.tie_word_embeddings:
            head = self.embed
        self.lm_head: LinearLayer = linear(head)
        # a tied int8 head holds the embedding too: look rows up there, no fp32 copy
        self._rows = getattr(self.lm_head, "rows", None) if head is self.embed else None
        if self._rows is not None:
            self.embed = None
        self.rope = RotaryEmbedding(self.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling)
        self.ops: TorchOps = layer_ops()

    def linears_by_kind(self) -> dict[str, list[LinearLayer]]:
        """Every matrix product of the model, by kind: what a per-kind format choice applies to."""
        kinds = {k: [getattr(layer, k) for layer in self.layers] for k in LINEAR_KINDS[:-1]}
        return {**kinds, "head": [self.lm_head]}

    def num_parameters(self) -> int:
        """Parameters a token's forward pass multiplies by (the tied head counted once)."""
        linears = [self.lm_head] + [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        norms = self.norm.numel() + sum(layer.input_norm.numel() + layer.post_norm.numel() for layer in self.layers)
        return sum(m.out_features * m.in_features for m in linears) + norms

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Hidden states [T, hidden] before the final norm, for every input token."""
        ops, eps = self.ops, self.eps
        # the residual stream: a fresh tensor, updated in place
        x = self._rows(input_ids) if self._rows is not None else self.embed.index_select(0, input_ids)
        delta = None  # what the previous sublayer adds to x
        for layer, (kc, vc) in zip(self.layers, kv_caches):
            h = ops.rms_norm(x, layer.input_norm, eps) if delta is None \
                else ops.add_rms_norm_(x, delta, layer.input_norm, eps)
            q = ops.rope_and_cache_(layer.qkv(h), positions, self.rope, kc, vc, meta.slot_mapping,
                                    self.num_heads, self.num_kv_heads)
            h = ops.add_rms_norm_(x, layer.o(paged_attention(q, kc, vc, meta, self.scale)), layer.post_norm, eps)
            delta = layer.down(ops.silu_mul(layer.gate_up(h)))
        if delta is not None:
            x.add_(delta)
        return x

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and output head for the rows that sample only."""
        return self.lm_head(self.ops.rms_norm(hidden.contiguous(), self.norm, self.eps)).float()

    def allocate_kv_cache(self, num_blocks: int, block_size: int,
                          dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (num_blocks * block_size, self.num_kv_heads, self.head_dim)
        pool = lazily_zeroed((2 * self.config.num_hidden_layers, *shape), dtype)
        return [(pool[2 * i], pool[2 * i + 1]) for i in range(self.config.num_hidden_layers)]
