"""Choose the linear-layer implementation for a weight format."""

from __future__ import annotations

import torch

from llmserve.models.linear import LinearFactory, dense_factory


def linear_factory_for(dtype: str) -> LinearFactory:
    if dtype == "fp32":
        return dense_factory(torch.float32)
    if dtype == "bf16":
        return dense_factory(torch.bfloat16)
    if dtype == "int8":
        from llmserve.models.quant import int8_factory

        return int8_factory()
    raise ValueError(f"unknown weight format {dtype!r}")
