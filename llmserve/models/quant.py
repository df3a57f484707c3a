"""int8 weights: per-output-channel int8, dynamic int8 activations, torch's own kernels.

``torch.ops.quantized.linear_dynamic`` (fbgemm on x86, qnnpack on Arm) quantises each
activation row on the fly and runs an int8 GEMM; weights stream at a quarter of
fp32's bytes, which is what bounds a decode step on a CPU. The quantised form
(int8 values + one scale per output channel) is what the model store caches.
"""

from __future__ import annotations

import warnings

import torch

from llmserve.models.linear import LinearFactory


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: ``w ≈ q * scale[:, None]``."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-10)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def _engine() -> str:
    engines = torch.backends.quantized.supported_engines
    for name in ("fbgemm", "x86", "qnnpack"):
        if name in engines:
            return name
    raise RuntimeError("this torch build has no quantized CPU engine; use dtype fp32")


class Int8Linear:
    """Packed int8 weight; ``x`` stays fp32 outside the kernel."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch marks quantized tensor creation deprecated
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
            self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.out_features, self.in_features = q.shape
        # fbgemm's AVX2 path can saturate with full-range activations; qnnpack cannot.
        self.reduce_range = torch.backends.quantized.engine in ("fbgemm", "x86")

    @classmethod
    def from_float(cls, w: torch.Tensor) -> "Int8Linear":
        return cls(*quantize_per_channel(w))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)


def int8_factory() -> LinearFactory:
    torch.backends.quantized.engine = _engine()
    return Int8Linear.from_float
