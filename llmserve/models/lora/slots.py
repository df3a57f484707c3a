"""Per-row LoRA in one step: the resident adapters in slots, each adapter's rows multiplied by its own.

S-LoRA / Punica's gathered products (SGMV), in one C++ call per product (``csrc/lora_sgmv.cpp``;
torch's ops where the kernels cannot be had: the same arithmetic). A step's rows are grouped by adapter
(the runner lays each adapter's requests side by side, and a request's rows are contiguous);
:meth:`LoraSlots.begin_step` turns that into segments ``(slot, first row, end row)`` once per
step, and every wrapped product of every layer then runs, per segment, ``h = x[seg] @ A.T`` and
``y[seg, cols] += h[:, part] @ B`` for each module of the product. Rows of the base model cost
nothing, and no row is multiplied by another adapter's factors (the masked product over every
slot did ``slots`` times the work).

Where the decoder fuses a product (q/k/v into ``qkv``, gate/up into ``gate_up``) a slot holds
the adapter's ``A`` of its modules stacked ``[r_q + r_k + r_v, in]``: one GEMM for all of them.
Each module's rows are packed at its own rank (no padding to ``--max-lora-rank``, none for a
module the adapter does not target), so an adapter's slot holds and reads just its factors.
The delta is added in fp32 on top of whatever the base product is (fp32, bf16 or int8 weights):
the merged weight's ``x @ (W + B A).T`` up to rounding.

The engine runs on the CPU, so the slot is the adapter's one copy in memory: :meth:`write`
takes the tensors in and :meth:`read` gives them back when the slot is needed for another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmserve.models.config import ModelConfig
from llmserve.models.lora.adapter import LoraAdapter, model_modules


class _Stack:
    """One (layer, product)'s slots: ``a`` [slots, groups * R, in] (modules' rows packed at their
    ranks) and ``bt`` [slots, R, out] (each group's ``B`` transposed in its columns, ``b[g]``);
    ``parts`` [slots, groups, 4]: each module's (first row in ``a``, rank, start, stop), rank 0
    where the slot's adapter lacks it (the kernel's table)."""

    def __init__(self, slots: int, groups: list[tuple[int, int]], rank: int, in_features: int,
                 dtype: torch.dtype) -> None:
        self.groups = groups  # (start, stop) output columns of each group
        self.a = torch.zeros(slots, len(groups) * rank, in_features, dtype=dtype)
        self.bt = torch.zeros(slots, rank, groups[-1][1], dtype=dtype)
        self.b = [self.bt[:, :, start:stop] for start, stop in groups]
        self.parts = torch.zeros(slots, len(groups), 4, dtype=torch.long)
        self.parts[:, :, 2:] = torch.tensor(groups, dtype=torch.long)


@dataclass(frozen=True, slots=True)
class _Part:
    """One module of an adapter in a slot: its rows ``lo:hi`` of ``h``, its ``B`` and columns."""

    module: str
    lo: int
    hi: int
    start: int
    stop: int
    b: torch.Tensor  # [r, out] view into the slot


@dataclass(frozen=True, slots=True)
class _Product:
    """What a slot's adapter does to one (layer, product): ``h = x @ at`` then each part."""

    at: torch.Tensor  # [in, sum of the ranks] view into the slot
    parts: tuple[_Part, ...]


class LoraSlots:
    """``num_slots`` adapters resident at once, each in a slot; the model's LoRA-wrapped
    products call :meth:`add_delta` between :meth:`begin_step` and :meth:`end_step`."""

    def __init__(self, config: ModelConfig, num_slots: int, max_rank: int, use_kernels: bool = True,
                 dtype: torch.dtype = torch.float32) -> None:
        """``use_kernels``: the C++ kernel where it can be had (False: torch's ops, for comparison).
        ``dtype``: the factors' storage, float32 or float16 (half the memory and the reads; the
        products still add up in fp32)."""
        from llmserve.models import kernels

        if dtype not in (torch.float32, torch.float16):
            raise ValueError(f"LoRA factors are stored as float32 or float16, not {dtype}")
        self.num_slots, self.rank, self.dtype = num_slots, max_rank, dtype
        self._kernels = kernels.load() if use_kernels else None
        self.spots = model_modules(config)
        by_kind: dict[str, dict[int, tuple[int, int, int]]] = {}
        for s in self.spots.values():
            by_kind.setdefault(s.kind, {})[s.group] = (s.start, s.stop, s.in_features)
        self.stacks = [{kind: _Stack(num_slots, [(g[0], g[1]) for _, g in sorted(gs.items())], max_rank,
                                     next(iter(gs.values()))[2], dtype) for kind, gs in by_kind.items()}
                       for _ in range(config.num_hidden_layers)]
        # per slot: (layer, kind) -> its _Product (absent: the adapter leaves that product alone)
        self._products: list[dict[tuple[int, str], _Product]] = [{} for _ in range(num_slots)]
        self._segments: list[tuple[dict[tuple[int, str], _Product], int, int]] = []
        self._segs = torch.zeros(0, 3, dtype=torch.long)  # the kernel's (slot, first row, end row)

    @property
    def slot_bytes(self) -> int:
        """Memory one slot holds (allocated at start for ``--max-loras``): an adapter of rank R on
        every module fills it exactly; lower ranks and fewer modules use part of it."""
        return sum(st.a[0].nbytes + sum(b[0].nbytes for b in st.b) for layer in self.stacks
                   for st in layer.values())

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Put ``adapter`` in ``slot`` (whatever was there is dropped)."""
        self.clear(slot)
        by_product: dict[tuple[int, str], list[tuple[int, str, torch.Tensor, torch.Tensor]]] = {}
        for (layer, module), (a, b) in adapter.deltas.items():
            spot = self.spots[module]
            by_product.setdefault((layer, spot.kind), []).append((spot.group, module, a, b))
        for (layer, kind), mods in by_product.items():
            st, lo, parts = self.stacks[layer][kind], 0, []
            for group, module, a, b in sorted(mods, key=lambda m: m[0]):
                r = a.shape[0]
                start, stop = st.groups[group]
                st.a[slot, lo:lo + r].copy_(a)
                st.b[group][slot, :r].copy_(b.t())
                st.parts[slot, group, :2] = torch.tensor([lo, r])
                parts.append(_Part(module, lo, lo + r, start, stop, st.b[group][slot, :r]))
                lo += r
            self._products[slot][(layer, kind)] = _Product(st.a[slot, :lo].t(), tuple(parts))

    def read(self, slot: int) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
        """The deltas in ``slot`` as :class:`LoraAdapter` holds them (copies in the slot's dtype:
        bit for bit what was written when that is float32)."""
        copy = torch.contiguous_format  # (always a copy: the slot is cleared after)
        return {(layer, p.module): (prod.at[:, p.lo:p.hi].t().clone(memory_format=copy),
                                    p.b.t().clone(memory_format=copy))
                for (layer, _), prod in self._products[slot].items() for p in prod.parts}

    def clear(self, slot: int) -> None:
        for (layer, kind), prod in self._products[slot].items():
            st = self.stacks[layer][kind]
            st.a[slot, :prod.at.shape[1]].zero_()
            for p in prod.parts:
                p.b.zero_()
            st.parts[slot, :, :2] = 0
        self._products[slot] = {}

    def begin_step(self, row_slots: list[int]) -> None:
        """Each row's slot for the coming forward pass (-1: the base model): the segments of
        consecutive rows on one slot, once for every layer."""
        segments, start = [], 0
        for i in range(1, len(row_slots) + 1):
            if i == len(row_slots) or row_slots[i] != row_slots[start]:
                if row_slots[start] >= 0:
                    segments.append((row_slots[start], start, i))
                start = i
        self._segments = [(self._products[slot], lo, hi) for slot, lo, hi in segments]
        if segments and self._kernels is not None:
            self._segs = torch.tensor(segments, dtype=torch.long)

    def end_step(self) -> None:
        self._segments = []

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, kind: str) -> None:
        """``y += x @ (B_row A_row).T`` row by row, in place."""
        if not self._segments:
            return
        if self._kernels is not None and y.dtype == x.dtype == torch.float32 and y.is_contiguous() \
                and x.is_contiguous():
            st = self.stacks[layer][kind]
            self._kernels.lora_sgmv_(y, x, st.a, st.bt, st.parts, self._segs)
            return
        key = (layer, kind)
        for products, lo, hi in self._segments:
            prod = products.get(key)
            if prod is None:
                continue
            h = torch.mm(x[lo:hi], prod.at.to(x.dtype))
            for p in prod.parts:
                y[lo:hi, p.start:p.stop].addmm_(h[:, p.lo:p.hi], p.b.to(x.dtype))


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
