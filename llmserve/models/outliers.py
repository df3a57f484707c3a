"""Outlier channels: a layer's few input channels whose activations run far above the rest,
taken in fp32 so that one-byte rounding holds for the others (LLM.int8()'s decomposition).

Rounding a row per 32 values into one byte sets each group's step by its largest value, so
one outlier coarsens the other 31. SmolLM2's inputs to qkv and gate_up carry such channels
(the residual stream's "massive activations", the same few channels in every layer: 247,
308, 14, 446, ...; a layer's largest channel runs 9-28x its median one), and one byte on
them fails the quality bar (97.1 % teacher-forced top-1 against fp32). With each layer's
``CHANNELS`` largest input channels set aside, the kernel rounds the rest into one byte and
adds the set-aside channels' fp32 values times their weights in float16 (``qdot_linear.cpp``): half the
integer multiplies of two bytes for ``CHANNELS`` fp32 multiply-adds a row and output.

The channels are a layer's own and the same for every row, so a row's product does not
depend on the batch around it. They are those of the largest magnitude over a calibration
text (Python's own pydoc topics: neither the held-out text that judges quality,
``benchmarks/activation_quality.py``, nor anything a client sends), found once when the
model is set up, with two-byte rounding everywhere.
"""

from __future__ import annotations

import torch

from llmserve.models.quant import WeightOnlyInt8Linear

# Set-aside channels per layer, by kind. All 7,498 held-out tokens, every row through the
# kernel (benchmarks/results/activation_quality-default.md): one byte on every kind less these
# channels, their weights in float16, top-1 98.25 %, perplexity +0.11 % (98.41 %, +0.13 % since the
# kernels' epilogue sums in another float order, 2026-12-06; fp32 weights: 98.35 %,
# +0.09 %), against 98.31 %, +0.16 % for two bytes on qkv and gate_up (the default before). With
# fp32 weights: calibrated on 512 tokens 98.39 %, 16 on every kind 98.12 %, 64 on qkv and
# gate_up (32 on o and down) 98.51 %. Each channel costs a row and output one fp32 multiply-add
# beside a quarter of a byte product's instruction per weight: 32 on a 576-wide input add ~20 %
# to its one-byte product. The float16 weights add ~9 MB to SmolLM2's instance, bytes a one-row
# step streams: there the products take ~1.1x the time of two bytes without them (4 rows: 0.9x).
CHANNELS = {"qkv": 32, "gate_up": 32, "o": 16, "down": 16}
CALIBRATION_TOKENS = 128  # ~0.2 s when an engine starts (through the kernel, two bytes)


def calibration_text() -> str:
    """The calibration text: the first of Python's pydoc topics (shipped with CPython)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:12_000]


def calibration_ids(tokenizer) -> list[int]:
    """The calibration text's first ``CALIBRATION_TOKENS`` token ids."""
    return tokenizer.encode(calibration_text())[:CALIBRATION_TOKENS]


class _Recorder:
    """A layer that keeps each input channel's largest magnitude while it runs."""

    def __init__(self, inner) -> None:
        self.inner, self.absmax = inner, None
        self.out_features, self.in_features = inner.out_features, inner.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().reshape(-1, self.in_features).abs().amax(dim=0)
        self.absmax = a if self.absmax is None else torch.maximum(self.absmax, a)
        return self.inner(x)


@torch.inference_mode()
def channel_absmax(model, ids: list[int], kinds) -> dict[tuple[str, int], torch.Tensor]:
    """Per (kind, layer index): each input channel's largest magnitude over ``ids``, the
    model's int8 layers rounding into two bytes."""
    from llmserve.models.attention import AttentionMetadata, build_group

    layers = {(kind, i): getattr(layer, kind) for i, layer in enumerate(model.layers) for kind in kinds}
    # (the kernel's two bytes on every row, not unpacking: that would unpack every layer once
    # more, ~2 ms a token more for a short text)
    saved = {key: (lay.FINE, lay.unpacked) for key, lay in layers.items() if isinstance(lay, WeightOnlyInt8Linear)}
    recorders = {key: _Recorder(lay) for key, lay in layers.items()}
    try:
        for (kind, i), rec in recorders.items():
            if (kind, i) in saved:
                rec.inner.FINE, rec.inner.unpacked = True, None
            setattr(model.layers[i], kind, rec)
        t = len(ids)
        caches = model.allocate_kv_cache(1, t, torch.float16, grouped=False)
        meta = AttentionMetadata(torch.arange(t), [build_group(0, t, [t], [[0]], t, model.num_heads // model.num_kv_heads)])
        model.forward(torch.tensor(ids), torch.arange(t), meta, caches)
    finally:
        for (kind, i), rec in recorders.items():
            setattr(model.layers[i], kind, rec.inner)
            if (kind, i) in saved:
                rec.inner.FINE, rec.inner.unpacked = saved[(kind, i)]
    return {key: rec.absmax for key, rec in recorders.items()}


def split(model, ids: list[int], channels: dict[str, int] | None = None) -> int:
    """Sets each int8 layer of the ``channels`` kinds (default ``CHANNELS``, read at the call)
    to one-byte activations less its largest input channels over ``ids`` (taken exactly);
    returns how many layers it set (0, with no forward pass, for a model without the
    kernel's layers)."""
    channels = CHANNELS if channels is None else channels
    kinds = [k for k, n in channels.items() if n > 0]
    if not ids or not any(isinstance(layer, WeightOnlyInt8Linear) and layer._product is not None
                          for kind in kinds for layer in model.linears_by_kind().get(kind, [])):
        return 0
    absmax = channel_absmax(model, ids, kinds)
    done = 0
    for (kind, i), a in absmax.items():
        layer = getattr(model.layers[i], kind)
        if not isinstance(layer, WeightOnlyInt8Linear) or layer._product is None:
            continue
        layer.set_outliers(a.topk(min(channels[kind], a.numel())).indices.sort().values)
        layer.FINE, layer.RESCORE = False, 0
        done += 1
    return done
