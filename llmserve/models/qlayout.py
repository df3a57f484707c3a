"""The bytes the int8 decode kernel streams (``csrc/qdot_linear.cpp``), packed once at load.

The int8 form (:func:`llmserve.models.quant.quantize_groups`: a code per weight, a scale
and an offset per 32 weights) is repacked three ways, because a decode step is bound by
the bytes its weights stream and by the instructions per weight:

- 4-bit codes where every group of a matrix is on 16 levels (a GGUF Q4_1 / Q4_K source:
  its int8 codes are then ``17 * j - 128``, j = 0..15, so ``W = j * 17 * scale +
  (offset - 128 * scale)`` holds it exactly): half a byte per weight. The kernel centres
  them (j - 7.5) against the rounded activations. Other matrices (the Q8_0 embedding /
  output head) keep their 8-bit codes.
- Tiles of 8 outputs. A tile's group is 8 steps of 32 bytes, each holding 4 consecutive
  codes of each of the 8 outputs (the layout VNNI's dot products want): maddubs + madd
  then sum 4 products per output in place and the kernel never sums horizontally. 4-bit
  codes put step 2i in the low nibbles and step 2i + 1 in the high ones of 32 bytes.
  Scales and offsets are ``[tiles, groups, 8]``: one vector per tile and group. The rows
  of the last tile past ``out_features`` are zero.
- Scales and offsets in float16 where that moves no weight by more than a thousandth of its
  group's step (GGUF files store them as float16, so theirs lose nothing), else float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmserve.models import kernels

GROUP = 32  # weights per affine map: GGUF's Q8_0 / Q4_1 block size
TILE = 8  # outputs per tile: one AVX2 float vector
STEPS = GROUP // 4  # 4 codes per output and step
FP16_TOLERANCE = 1e-3  # of a group's step


@dataclass
class PackedWeights:
    """``W[n, k] = code * scale + offset`` per 32-weight group, in the kernel's layout."""

    codes: torch.Tensor  # uint8 [tiles, groups * 128] (4-bit) or int8 [tiles, groups * 256] (8-bit)
    scale: torch.Tensor  # float16 or float32 [tiles, groups, 8]
    offset: torch.Tensor
    out_features: int

    @property
    def in_features(self) -> int:
        return self.scale.shape[1] * GROUP

    @property
    def bits(self) -> int:
        return 4 if self.codes.dtype == torch.uint8 else 8

    def dequantized(self) -> torch.Tensor:
        """The fp32 ``[out_features, in_features]`` weights these bytes hold."""
        n, k = self.out_features, self.in_features
        if self.bits == 4:
            codes = _unpack4(self.codes, n, k)
        else:
            codes = _unsteps(self.codes.view(torch.uint8), n).view(torch.int8)
        g = codes.float().reshape(n, k // GROUP, GROUP)
        scale, offset = untile(self.scale.float(), n), untile(self.offset.float(), n)
        return (g * scale[..., None] + offset[..., None]).reshape(n, k).contiguous()

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """``dequantized()[index]`` without the rest: a tied embedding's lookup, the rows a
        rescored head recomputes (the kernel where it loads: one pass, not ~10 torch ops)."""
        if (k := kernels.load()) is not None:
            return k.unpack_rows(self.codes, self.scale, self.offset, self.out_features, index.reshape(-1).long())
        t, j, groups = index // TILE, index % TILE, self.in_features // GROUP
        if self.bits == 8:  # one gather of the rows' own bytes (not their whole tiles): the head's rescoring
            codes = self.codes.view(-1, groups, STEPS, TILE, 4)[t, :, :, j, :]
        else:
            c = self.codes[t].reshape(-1, groups, STEPS // 2, 1, TILE * 4)
            c = torch.cat([c & 0x0F, c >> 4], 3)
            codes = c.reshape(-1, groups, STEPS, TILE, 4)[torch.arange(len(index)), :, :, j, :]
        g = codes.float().reshape(len(index), groups, GROUP)
        w = g * self.scale[t, :, j].float()[..., None] + self.offset[t, :, j].float()[..., None]
        return w.reshape(len(index), -1)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "scale": self.scale, "offset": self.offset}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], shape: tuple[int, int]) -> PackedWeights | None:
        """Back from :meth:`tensors` for a ``shape`` weight; None where they do not fit it."""
        n, k = shape
        tiles, groups = -(-n // TILE), k // GROUP
        codes, scale, offset = t.get("codes"), t.get("scale"), t.get("offset")
        if codes is None or scale is None or offset is None or k % GROUP:
            return None
        width = {torch.uint8: groups * GROUP * TILE // 2, torch.int8: groups * GROUP * TILE}.get(codes.dtype)
        if tuple(codes.shape) != (tiles, width) or tuple(scale.shape) != (tiles, groups, TILE) \
                or scale.dtype not in (torch.float16, torch.float32) \
                or offset.shape != scale.shape or offset.dtype != scale.dtype:
            return None
        return cls(codes.contiguous(), scale.contiguous(), offset.contiguous(), n)


def pack(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, *, four_bit: bool = True,
         fp16: bool = True) -> PackedWeights:
    """The kernel's layout of the int8 form ``q`` [N, K], ``scale`` / ``offset`` [N, K / 32];
    ``four_bit`` / ``fp16`` False keep 8-bit codes / float32 scales (for comparisons)."""
    n = q.shape[0]
    scale, offset = scale.float(), offset.float()
    levels = q.int() + 128
    if four_bit and bool((levels % 17 == 0).all()):
        codes = _pack4(levels // 17)
        scale, offset, top = 17 * scale, offset - 128 * scale, 15
    else:
        codes = _steps(q.view(torch.uint8)).reshape(-(-n // TILE), -1).view(torch.int8).contiguous()
        top = 128
    dtype = torch.float16 if fp16 and _fp16_holds(scale, offset, top) else torch.float32
    return PackedWeights(codes, tile(scale.to(dtype)), tile(offset.to(dtype)), n)


def _fp16_holds(scale: torch.Tensor, offset: torch.Tensor, top: int) -> bool:
    """Whether float16 scales and offsets move no weight (|code| <= top) by more than
    FP16_TOLERANCE of its group's step."""
    ds = (scale.half().float() - scale).abs()
    do = (offset.half().float() - offset).abs()
    return bool((ds * top + do <= FP16_TOLERANCE * scale.abs()).all())


def tile(s: torch.Tensor) -> torch.Tensor:
    """[N, G] -> [ceil(N / 8), G, 8], zeros past N."""
    n, g = s.shape
    tiles = -(-n // TILE)
    s = torch.cat([s, s.new_zeros(tiles * TILE - n, g)]) if tiles * TILE != n else s
    return s.reshape(tiles, TILE, g).transpose(1, 2).contiguous()


def untile(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.transpose(1, 2).reshape(-1, t.shape[1])[:n]


def _steps(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] bytes -> [tiles, groups, steps, 8 outputs x 4 codes]."""
    n, k = codes.shape
    tiles, groups = -(-n // TILE), k // GROUP
    if tiles * TILE != n:
        codes = torch.cat([codes, codes.new_zeros(tiles * TILE - n, k)])
    return codes.reshape(tiles, TILE, groups, STEPS, 4).permute(0, 2, 3, 1, 4).reshape(tiles, groups, STEPS, TILE * 4)


def _unsteps(b: torch.Tensor, n: int) -> torch.Tensor:
    tiles = b.shape[0]
    b = b.reshape(tiles, -1, STEPS, TILE, 4)
    return b.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, -1)[:n]


def _pack4(levels: torch.Tensor) -> torch.Tensor:
    s = _steps(levels.to(torch.uint8))
    return (s[:, :, 0::2] | (s[:, :, 1::2] << 4)).reshape(s.shape[0], -1).contiguous()


def _unpack4(b: torch.Tensor, n: int, k: int) -> torch.Tensor:
    b = b.reshape(b.shape[0], k // GROUP, STEPS // 2, 1, TILE * 4)
    return _unsteps(torch.cat([b & 0x0F, b >> 4], 3), n)
