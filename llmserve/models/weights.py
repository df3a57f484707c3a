"""Choose the linear-layer implementation for a weight format, and cache prepared forms.

Quantising and packing the model's weights (int8) takes seconds of start-up;
:class:`PreparedCache` keeps the packed result in the model store so later starts read
it back (memory-mapped) instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from llmserve.models.files import atomic_target
from llmserve.models.linear import LinearFactory, LinearLayer, dense_factory

if TYPE_CHECKING:
    from llmserve.models.quant import Unpacked

log = logging.getLogger(__name__)

PREPARED_FORMAT = 3  # bump when a prepared layout or the quantisation changes (3: qlayout's packing)


def resolve_dtype(dtype: str, quantized_source: bool) -> str:
    """``auto`` -> int8 for weights decoded from a block-quantised file when the int8 kernel
    runs on this machine (faster, and the int8 form holds such weights as they are), else fp32."""
    if dtype != "auto":
        return dtype
    if quantized_source:
        from llmserve.models import kernels

        if kernels.load() is not None:
            return "int8"
    return "fp32"


def linear_factory_for(dtype: str, prepared: Path | None = None, exact: bool = False,
                       unpack: bool = False) -> LinearFactory:
    """The factory for ``dtype``; with ``prepared`` (a folder), an int8 form is cached there.
    Where int8 layers send prefill rows (``WeightOnlyInt8Linear``): ``exact``, to fp32 GEMM
    on kept fp32 weights; else ``unpack``, to fp32 GEMM on weights unpacked from the codes
    a layer at a time; else to the int8 kernel like every row."""
    if dtype == "fp32":
        return dense_factory(torch.float32)
    if dtype == "bf16":
        return dense_factory(torch.bfloat16)
    if dtype == "int8":
        from llmserve.models.quant import Unpacked, int8_factory

        unpacked = Unpacked() if unpack and not exact else None
        factory = int8_factory(exact, unpacked)
        # a subfolder: the converted model's loader reads every *.safetensors beside it
        return PreparedCache(prepared / "int8" / f"v{PREPARED_FORMAT}.safetensors", factory, exact, unpacked) \
            if prepared is not None else factory
    if dtype == "w8a8":
        from llmserve.models.quant import w8a8_factory

        return w8a8_factory()
    raise ValueError(f"unknown weight format {dtype!r}")


class PreparedCache:
    """Wraps the int8 factory: layers come from the cache file in call order (the model
    builds them in a fixed order) and a miss quantises; ``save`` writes what was built."""

    def __init__(self, path: Path, factory: LinearFactory, exact: bool = False,
                 unpacked: "Unpacked | None" = None) -> None:
        self.path = path
        self.factory = factory
        self.exact = exact
        self.unpacked = unpacked  # shared with the factory's layers
        self.built: list[LinearLayer] = []
        self.cached: dict[str, torch.Tensor] = {}
        self.hits = 0
        if path.is_file():
            try:
                from safetensors import safe_open
                from safetensors.torch import load_file

                with safe_open(str(path), "pt") as f:
                    version = (f.metadata() or {}).get("version")
                if version == str(PREPARED_FORMAT):
                    self.cached = load_file(str(path))
                else:
                    log.warning("ignoring a prepared-weights cache of another format: %s", path)
            except Exception as e:  # noqa: BLE001 - a broken cache is rebuilt, never fatal
                log.warning("ignoring a broken prepared-weights cache %s: %s", path, e)

    def __call__(self, w: torch.Tensor) -> LinearLayer:
        from llmserve.models.qlayout import PackedWeights
        from llmserve.models.quant import WeightOnlyInt8Linear

        i = len(self.built)
        fields = {name: self.cached.get(f"{i}.{name}") for name in ("codes", "scale", "offset")}
        packed = PackedWeights.from_tensors(fields, tuple(w.shape))
        if packed is not None:
            keep = WeightOnlyInt8Linear.keeps_source(self.exact)
            layer: LinearLayer = WeightOnlyInt8Linear(packed, dense=w.float().contiguous() if keep else None,
                                                      unpacked=self.unpacked)
            self.hits += 1
        else:
            layer = self.factory(w)
        self.built.append(layer)
        return layer

    def save(self) -> None:
        """Write the cache if any layer was quantised this time (best effort)."""
        if self.hits == len(self.built):
            return
        from safetensors.torch import save_file

        tensors = {}
        for i, layer in enumerate(self.built):
            tensors.update({f"{i}.{name}": t for name, t in layer.packed.tensors().items()})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_target(self.path) as tmp:
                save_file(tensors, tmp, metadata={"format": "llmserve-int8", "version": str(PREPARED_FORMAT),
                                                  "layers": str(len(self.built))})
        except OSError as e:
            log.warning("could not cache the int8 weights in %s: %s", self.path, e)
