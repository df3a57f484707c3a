"""Per-row LoRA in one step: every resident adapter's factors stacked, each row gathering its own.

S-LoRA / Punica's idea on CPU GEMMs. For each (layer, product) the resident adapters' ``A``
factors are one tensor ``[slots, groups, R, in]`` (a group per module fused into the product:
q, k, v of ``qkv``) and each group's ``B`` one tensor ``[slots, R, out]``; ranks under ``R``
are zero-padded. A step multiplies the rows by the first ``hi`` slots' ``A`` at once, zeroes
each row's columns of every slot but its own (the mask is gathered by the row's slot index,
built once per step), then adds ``h @ B`` to each group's column range of the base output:
two GEMMs per product, whatever the mix of adapters in the batch. The delta is added in fp32
on top of whatever the base product is (fp32, bf16 or int8 weights), the merged weight's
``x @ (W + B A).T`` up to rounding. A row of no adapter (slot -1) gets an exact zero.
"""

from __future__ import annotations

import torch

from llmserve.models.config import ModelConfig
from llmserve.models.lora.adapter import LoraAdapter, model_modules


class _Stack:
    def __init__(self, slots: int, groups: list[tuple[int, int]], rank: int, in_features: int) -> None:
        self.groups = groups  # (start, stop) output columns of each group
        self.a = torch.zeros(slots, len(groups), rank, in_features)
        self.b = [torch.zeros(slots, rank, stop - start) for start, stop in groups]


class LoraSlots:
    """``num_slots`` adapters resident at once, each in a slot; the model's LoRA-wrapped
    products call :meth:`add_delta` between :meth:`begin_step` and :meth:`end_step`."""

    def __init__(self, config: ModelConfig, num_slots: int, max_rank: int) -> None:
        self.num_slots, self.rank = num_slots, max_rank
        self.spots = model_modules(config)
        by_kind: dict[str, dict[int, tuple[int, int, int]]] = {}
        for s in self.spots.values():
            by_kind.setdefault(s.kind, {})[s.group] = (s.start, s.stop, s.in_features)
        self.stacks = [{kind: _Stack(num_slots, [(g[0], g[1]) for _, g in sorted(gs.items())], max_rank,
                                     next(iter(gs.values()))[2]) for kind, gs in by_kind.items()}
                       for _ in range(config.num_hidden_layers)]
        self._hi = 0  # slots this step reads (0: no row has an adapter)
        self._masks: dict[int, torch.Tensor] = {}

    @property
    def slot_bytes(self) -> int:
        """Memory one resident adapter holds, whatever its own rank (the stacks are padded to R)."""
        return sum(st.a[0].nbytes + sum(b[0].nbytes for b in st.b) for layer in self.stacks
                   for st in layer.values())

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Put ``adapter`` in ``slot`` (whatever was there is overwritten)."""
        self.clear(slot)
        for (layer, module), (a, b) in adapter.deltas.items():
            spot = self.spots[module]
            st = self.stacks[layer][spot.kind]
            r = a.shape[0]
            st.a[slot, spot.group, :r].copy_(a)
            st.b[spot.group][slot, :r].copy_(b.t())

    def clear(self, slot: int) -> None:
        for layer in self.stacks:
            for st in layer.values():
                st.a[slot].zero_()
                for b in st.b:
                    b[slot].zero_()

    def begin_step(self, row_slots: list[int]) -> None:
        """Each row's slot for the coming forward pass (-1: the base model)."""
        hi = max(row_slots, default=-1) + 1
        self._hi, self._masks = hi, {}
        if hi == 0:
            return
        rows = torch.tensor(row_slots, dtype=torch.long).view(-1, 1)
        for groups in {len(st.groups) for st in self.stacks[0].values()}:
            cols = torch.arange(hi).repeat_interleave(groups * self.rank).view(1, -1)
            self._masks[groups] = (rows == cols).float()

    def end_step(self) -> None:
        self._hi, self._masks = 0, {}

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, kind: str) -> None:
        """``y += x @ (B_row A_row).T`` row by row, in place."""
        hi = self._hi
        if hi == 0:
            return
        st = self.stacks[layer][kind]
        g, r, t = len(st.groups), self.rank, x.shape[0]
        h = torch.mm(x, st.a[:hi].view(hi * g * r, -1).t())
        h.mul_(self._masks[g])
        for i, (start, stop) in enumerate(st.groups):
            hg = h if g == 1 else h.view(t, hi, g, r)[:, :, i].reshape(t, hi * r)
            y[:, start:stop].addmm_(hg, st.b[i][:hi].view(hi * r, stop - start))


class LoraLinear:
    """A product of the model with the resident adapters' deltas added (the ``LinearLayer`` seam)."""

    def __init__(self, base, slots: LoraSlots, layer: int, kind: str) -> None:
        self.base, self.slots, self.layer, self.kind = base, slots, layer, kind
        self.out_features, self.in_features = base.out_features, base.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        self.slots.add_delta(y, x, self.layer, self.kind)
        return y

    def __getattr__(self, name: str):
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)  # the base's own attributes (int8 layout, rows, ...)


def install(model, slots: LoraSlots) -> None:
    """Wrap every product an adapter may target (all but the output head)."""
    kinds = {s.kind for s in slots.spots.values()}
    for i, layer in enumerate(model.layers):
        for kind in kinds:
            setattr(layer, kind, LoraLinear(getattr(layer, kind), slots, i, kind))
