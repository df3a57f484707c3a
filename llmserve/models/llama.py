"""The decoder of every supported family (RMSNorm, RoPE, grouped-query attention, a gated MLP)
over a paged KV pool; the config chooses the parts in which families differ (norm offsets,
q/k norms, qkv biases, GeGLU, sandwich norms, soft-caps, partial rotary, sliding windows).

Weights come in Hugging Face names and layout (see ``llmserve.models.loader``). The
model works on a flat batch of tokens ``[T]`` from many requests at once: matrix
products see no padding; only attention is grouped (``llmserve.models.attention``).
"""

from __future__ import annotations

import torch

from llmserve.models.attention import AttentionMetadata, paged_attention
from llmserve.models.config import ModelConfig
from llmserve.models.kv_layout import kv_layout
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


def _fused(w: dict[str, torch.Tensor], fused: str, parts: list[str]) -> torch.Tensor:
    """Phi-3 stores q/k/v and gate/up fused; the others apart (concatenated here, once)."""
    return w[fused] if fused in w else torch.cat([w[n] for n in parts])


class _Layer:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], i: int, linear: LinearFactory,
                 ropes: dict[str, RotaryEmbedding]) -> None:
        p = f"model.layers.{i}."

        def norm(name: str) -> torch.Tensor:
            # a new tensor: a view would keep the whole memory-mapped weights file resident
            return w[p + name].float() + cfg.norm_offset

        attn = [p + f"self_attn.{n}_proj" for n in "qkv"]
        self.input_norm = norm("input_layernorm.weight")
        self.post_norm = norm("post_attention_layernorm.weight")  # Gemma: after attention; else before the MLP
        self.pre_ff_norm = norm("pre_feedforward_layernorm.weight") if cfg.sandwich_norm else None
        self.post_ff_norm = norm("post_feedforward_layernorm.weight") if cfg.sandwich_norm else None
        self.qkv: LinearLayer = linear(_fused(w, p + "self_attn.qkv_proj.weight", [n + ".weight" for n in attn]))
        self.qkv_bias = torch.cat([w[n + ".bias"].float() for n in attn]) if cfg.qkv_bias else None
        self.q_norm = norm("self_attn.q_norm.weight") if cfg.qk_norm else None
        self.k_norm = norm("self_attn.k_norm.weight") if cfg.qk_norm else None
        self.o: LinearLayer = linear(w[p + "self_attn.o_proj.weight"])
        self.gate_up: LinearLayer = linear(_fused(w, p + "mlp.gate_up_proj.weight",
                                                  [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]))
        self.down: LinearLayer = linear(w[p + "mlp.down_proj.weight"])
        self.window = cfg.window(i)
        self.rope = ropes["sliding" if self.window is not None and "sliding" in ropes else "full"]


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
        self.scale = c.attn_scale
        self.eps = c.rms_norm_eps
        missing = [k for k in ("model.embed_tokens.weight", "model.norm.weight") if k not in weights]
        if missing:
            raise ValueError(f"model weights lack {missing}")
        self.embed = weights["model.embed_tokens.weight"].float()
        self.rope = RotaryEmbedding(self.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling,
                                    c.rotary_dim)
        ropes = {"full": self.rope}
        if c.rope_local_theta is not None:
            ropes["sliding"] = RotaryEmbedding(self.head_dim, c.max_position_embeddings, c.rope_local_theta,
                                               None, c.rotary_dim)
        self.layers = [_Layer(c, weights, i, linear, ropes) for i in range(c.num_hidden_layers)]
        self.kv_layout = kv_layout(c)
        self.norm = weights["model.norm.weight"].float() + c.norm_offset
        head = weights.get("lm_head.weight")
        if head is None or c.tie_word_embeddings:
            head = self.embed
        self.lm_head: LinearLayer = linear(head)
        # a tied int8 head holds the embedding too: look rows up there, no fp32 copy
        self._rows = getattr(self.lm_head, "rows", None) if head is self.embed else None
        if self._rows is not None:
            self.embed = None
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
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata | list[AttentionMetadata],
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Hidden states [T, hidden] before the final norm, for every input token. ``meta``:
        one per KV group (``kv_layout``), or one for all layers."""
        ops, eps, c = self.ops, self.eps, self.config
        metas = meta if isinstance(meta, list) else [meta] * self.kv_layout.num_groups
        # the residual stream: a fresh tensor, updated in place
        x = self._rows(input_ids) if self._rows is not None else self.embed.index_select(0, input_ids)
        if c.embed_scale != 1.0:
            x.mul_(c.embed_scale)
        delta = None  # what the previous sublayer adds to x
        for layer, (kc, vc), g in zip(self.layers, kv_caches, self.kv_layout.layer_group):
            meta = metas[g]
            h = ops.rms_norm(x, layer.input_norm, eps) if delta is None \
                else ops.add_rms_norm_(x, delta, layer.input_norm, eps)
            qkv = layer.qkv(h)
            if layer.qkv_bias is not None:
                qkv.add_(layer.qkv_bias)
            if layer.q_norm is not None:
                ops.qk_norm_(qkv, layer.q_norm, layer.k_norm, self.num_heads, self.num_kv_heads, eps)
            q = ops.rope_and_cache_(qkv, positions, layer.rope, kc, vc, meta.slot_mapping,
                                    self.num_heads, self.num_kv_heads)
            a = layer.o(paged_attention(q, kc, vc, meta, self.scale, layer.window, c.attn_softcap))
            if layer.pre_ff_norm is None:
                h = ops.add_rms_norm_(x, a, layer.post_norm, eps)
                delta = layer.down(self._gate(layer.gate_up(h)))
            else:
                h = ops.add_rms_norm_(x, ops.rms_norm(a, layer.post_norm, eps), layer.pre_ff_norm, eps)
                delta = ops.rms_norm(layer.down(self._gate(layer.gate_up(h))), layer.post_ff_norm, eps)
        if delta is not None:
            x.add_(delta)
        return x

    def _gate(self, gu: torch.Tensor) -> torch.Tensor:
        act = self.config.hidden_act
        return self.ops.silu_mul(gu) if act == "silu" else \
            self.ops.gelu_mul(gu, "tanh" if act == "gelu_tanh" else "none")

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and output head for the rows that sample only."""
        logits = self.lm_head(self.ops.rms_norm(hidden.contiguous(), self.norm, self.eps)).float()
        if (cap := self.config.logit_softcap) is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32,
                          grouped: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (K, V) pool. ``grouped``: a block is a page of ``group_size`` layers,
        addressed per KV group (``kv_layout``); else a page of every layer, one table for all."""
        shape = (num_blocks * block_size, self.num_kv_heads, self.head_dim)
        slots = self.kv_layout.layer_slot if grouped else range(self.config.num_hidden_layers)
        pool = lazily_zeroed((2 * len(set(slots)), *shape), dtype)
        return [(pool[2 * s], pool[2 * s + 1]) for s in slots]
