"""The seam every matrix product of the model goes through.

A linear layer is anything with ``__call__(x) -> x @ W.T``. The dense fp32 / bf16 form
is here; quantised forms (int8) slot in behind the same two-method protocol, so the
model code never changes when the weight format does.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.nn.functional as F


class LinearLayer(Protocol):
    """``y = x @ W.T`` for a weight ``W`` of shape ``[out_features, in_features]``."""

    out_features: int
    in_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class DenseLinear:
    """Plain ``F.linear``; activations are cast to the weight's dtype and back."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
        self.weight = weight.to(dtype).contiguous()
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:
            return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return F.linear(x, self.weight)


LinearFactory = Callable[[torch.Tensor], LinearLayer]


def dense_factory(dtype: torch.dtype = torch.float32) -> LinearFactory:
    return lambda w: DenseLinear(w, dtype)
