"""How a model's layers share the paged KV pool: KV groups, each with its own block table.

Where every layer sees the same window (all full, or all sliding as in Mistral), one group
holds every layer and a block is one page of each layer's KV. Where sliding and full layers
mix (Gemma 2 and 3, Qwen2 with ``use_sliding_window``), a sliding layer needs only its
window's blocks while a full layer needs them all; one block table for both would keep
every block for every layer. So, as vLLM's hybrid allocator does, layers of one kind are
split into groups of ``group_size`` layers, the same size for every kind (the gcd of the
counts), and a block is a page of ``group_size`` layers: one pool serves every group, and
each request has a block table per group. A sliding group frees its blocks left of the
window; a full group keeps them. Layer ``i`` reads and writes tensor ``layer_slot[i]``
through its group's table, so the layers at the same slot of different groups share one
tensor without ever sharing a block.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from llmserve.models.config import ModelConfig


@dataclass(frozen=True, slots=True)
class KVLayout:
    windows: tuple[int | None, ...]  # per group: its layers' sliding window; None: full attention
    layer_group: tuple[int, ...]  # per layer: its group
    layer_slot: tuple[int, ...]  # per layer: which of the group_size KV tensors holds it
    group_size: int

    @property
    def num_groups(self) -> int:
        return len(self.windows)


def kv_layout(config: ModelConfig) -> KVLayout:
    n = config.num_hidden_layers
    windows = [config.window(i) for i in range(n)]
    by_window: dict[int | None, list[int]] = {}
    for i, w in enumerate(windows):
        by_window.setdefault(w, []).append(i)
    size = 0
    for layers in by_window.values():
        size = gcd(size, len(layers))
    groups: list[int | None] = []
    layer_group, layer_slot = [0] * n, [0] * n
    for w, layers in by_window.items():
        for start in range(0, len(layers), size):
            for slot, i in enumerate(layers[start:start + size]):
                layer_group[i], layer_slot[i] = len(groups), slot
            groups.append(w)
    return KVLayout(tuple(groups), tuple(layer_group), tuple(layer_slot), size)
