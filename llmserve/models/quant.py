"""Quantised weights in two forms.

- ``int8`` (:class:`WeightOnlyInt8Linear`): a code per weight and an affine map per 32
  weights (GGUF's Q4_1 / Q8_0 levels held exactly), stored as 4-bit codes where the
  matrix is on 16 levels, else 8-bit (``qlayout``). Our AVX2 kernel (``kernels``)
  quantises the activations per 32 too and multiplies in integers, llama.cpp style;
  per-32 scales follow this model's outlier channels closely enough, where one scale per
  tensor does not (``w8a8``). Prefill rows go to torch's fp32 GEMM instead: by default on
  weights unpacked from the codes a layer at a time (:class:`Unpacked`), in the exact mode
  on kept fp32 copies.
- ``w8a8`` (:class:`Int8Linear`): int8 weights per output channel, activations quantised
  per tensor on the fly (``torch.ops.quantized.linear_dynamic``: fbgemm on x86, qnnpack
  on Arm). It loses far too much on SmolLM2 (perplexity +359 %).

The packed ``int8`` form is what the model store caches.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from llmserve.models import kernels
from llmserve.models.linear import LinearFactory
from llmserve.models.qlayout import GROUP, TILE, PackedWeights, pack


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


def w8a8_factory() -> LinearFactory:
    torch.backends.quantized.engine = _engine()
    return Int8Linear.from_float


def quantize_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int8 per 32 weights: ``w ≈ q * scale + offset`` group by group.

    Each group takes the better of two grids: 255 steps between its min and max
    (asymmetric), which holds GGUF's Q4_1 / Q4_K levels exactly (16 levels of the same
    span: 255 = 15 * 17), or steps of ``absmax / 127`` around zero (symmetric), which
    holds Q8_0's exactly. Weights that came from such a file come back as they were,
    up to float rounding; others lose at most half a step."""
    w = w.float()
    n, k = w.shape
    g = w.reshape(n, k // GROUP, GROUP)
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    a_scale = ((hi - lo) / 255.0).clamp(min=1e-12)
    a_codes = torch.round((g - lo[..., None]) / a_scale[..., None]).clamp(0, 255) - 128
    a_offset = lo + 128 * a_scale
    s_scale = (g.abs().amax(dim=2) / 127.0).clamp(min=1e-12)
    s_codes = torch.round(g / s_scale[..., None]).clamp(-127, 127)
    a_err = (a_codes * a_scale[..., None] + a_offset[..., None] - g).abs().amax(dim=2)
    s_err = (s_codes * s_scale[..., None] - g).abs().amax(dim=2)
    # a group on 16 levels (GGUF Q4_1 / Q4_K) stays on the min-max grid even where the
    # symmetric one happens to hold it as well: the layer can then store it as 4 bits
    on16 = ((a_codes + 128) % 17 == 0).all(dim=2)
    sym = (s_err < a_err) & ~on16
    q = torch.where(sym[..., None], s_codes, a_codes).to(torch.int8).reshape(n, k)
    scale = torch.where(sym, s_scale, a_scale)
    offset = torch.where(sym, torch.zeros_like(a_offset), a_offset)
    return q, scale.contiguous(), offset.contiguous()


class WeightOnlyInt8Linear:
    """``y = x @ W.T`` with ``W = code * scale + offset`` per 32-weight group.

    Our AVX2 kernel reads the packed codes (``qlayout``: 4 bits a weight for a Q4 source)
    and quantises each row of ``x`` per 32 on the fly, into two bytes (``FINE``) or one
    (llama.cpp's rounding; where a layer kind keeps quality, see ``ONE_BYTE_KINDS``), less
    the ``outliers`` channels it takes in fp32 (``outliers.py``). It
    runs on every row count: each row is rounded and summed alone, so a row's product does
    not depend on the batch around it (the model's output can: attention over a chunk of
    another shape differs in the last float bits, and a one-byte rounding can turn that into
    a level; so greedy tokens are exact across chunking, prefix hits, preemption and resume
    on the fp32 path only), and no fp32 copy of the weights is kept (4 bytes a
    weight against ~0.6). The price is prefill speed: at 48-512 rows the two-byte product
    ran at 0.4-0.8x torch's fp32 GEMM, the one-byte one at 0.75-1.7x (two runs on the
    loaded 2-core machine, benchmarks/results/int8_kernel-prefill.md). So more than
    ``SMALL_M`` rows (prefill chunks) go to torch's fp32 GEMM, without activation rounding:
    with ``unpacked``, on the weights unpacked from the codes into a buffer the model's
    layers share; in the exact mode, on the fp32 ``dense`` weights the codes came from,
    kept at 4 bytes a weight. For GGUF-sourced weights both are the same bits.
    """

    SMALL_M = 64  # the kernel up to this many rows (decode steps up to max_num_seqs' default), fp32 GEMM above
    # With unpacking, 8-bit codes (the Q8_0 head) cross over sooner at two bytes: at 32 / 64
    # rows the kernel took 18 / 38 ms for SmolLM2's head, unpack + GEMM 14 / 23 (2 threads,
    # AVX2). Rescored at one byte the head keeps the kernel up to SMALL_M: 10.1 / 22.0 ms at
    # 32 / 64 rows against unpack + GEMM's 12.7 / 21.5 on AVX2, 5.2 / 10.6 against 11.7 / 20.5
    # with VNNI (2 threads, quiet machine, 2026-12-03).
    SMALL_M_8BIT = 24
    FINE = True
    # After a one-byte product, this many of each row's largest outputs are computed again
    # in fp32 (0: none). A head's argmax then is the exact product's unless rounding pushed
    # the true top output below RESCORE others; the tail keeps the rounded values. Under
    # RESCORE_MIN_ROWS rows such a layer keeps two bytes: there reading the codes bounds both
    # products alike, and the recomputing would only add its ~0.3 ms (SmolLM2's head).
    RESCORE = 0
    RESCORE_MIN_ROWS = 6
    # The one-byte activations' bits on 8-bit codes: 8, or 7 (SEVEN_BIT_KINDS), where the AVX2
    # dot needs no sign fix-ups (csrc/qdot_linear.cpp); two-byte products ignore it.
    ACT_BITS = 8

    def __init__(self, packed: PackedWeights, dense: torch.Tensor | None = None,
                 unpacked: "Unpacked | None" = None) -> None:
        self.packed = packed
        self.out_features, self.in_features = packed.out_features, packed.in_features
        kernel = kernels.load()
        self._product = None if kernel is None else kernel.q4_linear if packed.bits == 4 else kernel.q8_linear
        # without the kernel the fp32 product is all there is
        self.dense = dense if dense is not None or self._product is not None else self.dequantized()
        self.unpacked = unpacked if self.dense is None else None
        self.outliers: tuple[torch.Tensor, torch.Tensor] | None = None  # (channels, their weights): outliers.py

    def set_outliers(self, channels: torch.Tensor) -> None:
        """Input ``channels`` (int64, ascending) the kernel takes on fp32 activations and
        their weights in float16 [tiles, len(channels), 8], when it rounds into one byte
        (``outliers.py``)."""
        n, k, p = self.out_features, len(channels), self.packed
        if self.dense is not None:
            w = self.dense[:, channels]
        else:  # (the kernel's unpacking: dequantized()'s bits, faster)
            w = kernels.load().unpack_weights(p.codes, p.scale, p.offset, n, torch.empty(n * p.in_features))[:, channels]
        tiles = -(-n // TILE)
        w = torch.cat([w.float(), w.new_zeros(tiles * TILE - n, k)]) if tiles * TILE > n else w.float()
        # float16: a one-row step streams these bytes beside the codes' (~0.55 a weight), and
        # fp32 weights would make them ~20 % more for SmolLM2
        self.outliers = (channels.to(torch.long).contiguous(),
                         w.reshape(tiles, TILE, k).transpose(1, 2).contiguous().half())

    @property
    def _unpack_above(self) -> int:
        return self.SMALL_M_8BIT if self.packed.bits == 8 and not self.RESCORE else self.SMALL_M

    @classmethod
    def from_float(cls, w: torch.Tensor, exact: bool = False,
                   unpacked: "Unpacked | None" = None) -> "WeightOnlyInt8Linear":
        """``exact``: keep ``w`` in fp32 for the rows above ``SMALL_M``; ``unpacked``: else
        send those rows to fp32 GEMM on the weights unpacked from the codes into it."""
        if w.shape[1] % GROUP:
            raise ValueError(f"int8 weights need an input size divisible by {GROUP}, got {w.shape[1]}")
        return cls(pack(*quantize_groups(w)), dense=w.float().contiguous() if cls.keeps_source(exact) else None,
                   unpacked=unpacked)

    @staticmethod
    def keeps_source(exact: bool) -> bool:
        """Whether a layer keeps its source weights in fp32: in exact mode, and without the kernel."""
        return exact or kernels.load() is None

    def dequantized(self) -> torch.Tensor:
        return self.packed.dequantized()

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows of ``W``: the lookup of an embedding tied to this head."""
        return self.dense.index_select(0, index) if self.dense is not None else self.packed.rows(index)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # (a step makes ~120 of these calls on [rows, features] float32: no reshape, no copy
        # and positional arguments there, ~5 us a call less than the general form)
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        rows = x2.shape[0]
        if self.dense is not None and (self._product is None or rows > self.SMALL_M):
            y = F.linear(x2, self.dense)
        elif self.unpacked is not None and rows > self._unpack_above:
            y = self.unpacked.linear(x2, self.packed)
        else:
            p = self.packed
            rescore = self.RESCORE > 0 and not self.FINE and rows >= self.RESCORE_MIN_ROWS
            fine = self.FINE or (self.RESCORE > 0 and not rescore)  # (a rescored layer's few rows: two bytes)
            chans, wo = self.outliers if not fine and self.outliers is not None else (None, None)
            if p.bits == 4:
                y = self._product(x2, p.codes, p.scale, p.offset, self.out_features, fine, chans, wo)
            else:  # 8-bit: the one-byte activations' bits too
                y = self._product(x2, p.codes, p.scale, p.offset, self.out_features, fine, chans, wo,
                                  8 if fine else self.ACT_BITS)
            if rescore:
                y = self._rescored(x2, y)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def _rescored(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` with each row's ``RESCORE`` largest outputs recomputed on fp32 activations
        (the weights' rows dequantized: what the exact path multiplies)."""
        k = min(self.RESCORE, self.out_features)
        idx = largest(y, k)
        w = self.rows(idx.reshape(-1)).view(x.shape[0], k, self.in_features)
        return y.scatter_(1, idx, torch.bmm(w, x.unsqueeze(2)).squeeze(2))


def largest(y: torch.Tensor, k: int, block: int = 64) -> torch.Tensor:
    """The indices of each row's ``k`` largest values (in no order), as ``topk`` finds them
    but ~4x faster on a vocabulary: each row's ``k`` largest lie in its ``k`` blocks of the
    largest maxima, so only those blocks are searched."""
    m, n = y.shape
    if n % block or n // block < k:
        return y.topk(k, dim=1, sorted=False).indices
    v = y.view(m, n // block, block)
    blocks = v.amax(-1).topk(k, dim=1, sorted=False).indices
    j = v.gather(1, blocks.unsqueeze(2).expand(m, k, block)).reshape(m, k * block).topk(k, dim=1, sorted=False).indices
    return blocks.gather(1, j // block) * block + j % block


# The layer kinds whose activations round into one byte without calibration: those meeting issue
# 21's bar together (teacher-forced top-1 >= 98 % of fp32, perplexity <= +0.5 %, on held-out
# text; benchmarks/results/activation_quality.md). On SmolLM2 that is o and down (98.6 %,
# +0.14 %) and the head with its top outputs recomputed (below); gate_up passes alone (98.3 %)
# but not beside o and down (97.3 %), qkv fails alone (97.9 %). With a calibration text,
# ``outliers.split`` rounds the kinds of ``outliers.CHANNELS`` into one byte too, less their
# outlier channels.
ONE_BYTE_KINDS = frozenset({"o", "down", "head"})
# The kinds whose one-byte products recompute their top outputs in fp32, and how many. The head
# at one byte alone: top-1 96.9 %; with each row's 8 largest logits recomputed 99.85 % (two
# bytes: 99.88 %), and beside o and down 98.56 %, +0.19 % perplexity (activation_quality.md).
# The head's product, one thread, 8 / 16 / 24 rows: 2.9 / 5.6 / 8.5 ms against two bytes' 4.6 / 9.8 / 15.0.
RESCORED_KINDS = {"head": 8}
# The one-byte kinds whose 8-bit codes take seven-bit activations: the rescored head, with the
# engine's default rounding elsewhere, top-1 98.41 % and perplexity +0.26 % on SmolLM2 against
# eight bits' 98.41 % and +0.13 % (six bits: +1.04 %, failing; benchmarks/head_activation_bits.py),
# for a product 0.87-0.88x the time on AVX2 (SmolLM2's head at 64 rows, linear_kernel_ab.py).
SEVEN_BIT_KINDS = frozenset({"head"})


def round_activations(model, one_byte: frozenset[str] = ONE_BYTE_KINDS,
                      rescored: dict[str, int] = RESCORED_KINDS, seven_bit: frozenset[str] = SEVEN_BIT_KINDS) -> None:
    """One-byte activations on the int8 layers of the ``one_byte`` kinds (their top outputs
    recomputed where ``rescored`` says; seven bits on the 8-bit codes of the ``seven_bit``
    kinds), two on the rest, no channel set aside; then ``outliers.split`` takes the kinds of
    ``outliers.CHANNELS`` to one byte as well."""
    for kind, layers in model.linears_by_kind().items():
        for layer in layers:
            if isinstance(layer, WeightOnlyInt8Linear):
                layer.FINE = kind not in one_byte
                layer.RESCORE = rescored.get(kind, 0) if kind in one_byte else 0
                layer.ACT_BITS = 7 if kind in one_byte and kind in seven_bit and layer.packed.bits == 8 else 8
                layer.outliers = None


class Unpacked:
    """The fp32 buffer a model's int8 layers unpack their weights into, a layer at a time,
    for steps above a layer's kernel rows (``SMALL_M``; ``SMALL_M_8BIT`` for 8-bit codes:
    prefill chunks, large decode batches on the head): torch's fp32 GEMM then runs on them
    without any layer keeping a 4-byte copy of its weights. Unpacking (``csrc/unpack.cpp``)
    gives the bits ``PackedWeights.dequantized`` gives, which for a GGUF Q4_1 / Q8_0 source
    are the file's weights. One buffer serves the model's layers in turn: not thread-safe,
    like the engine that steps them."""

    LIMIT = 1 << 20  # floats (4 MB, in cache): a larger layer (gate_up, the head) goes a slice of outputs at a time

    def __init__(self) -> None:
        self.buffer = torch.empty(0)

    def linear(self, x: torch.Tensor, p: PackedWeights) -> torch.Tensor:
        n, k = p.out_features, p.in_features
        tiles = -(-n // TILE)
        per = max(1, min(tiles, self.LIMIT // (k * TILE)))  # tiles a slice
        if self.buffer.numel() < per * TILE * k:
            self.buffer = torch.empty(per * TILE * k)
        unpack = kernels.load().unpack_weights
        if per == tiles:
            return F.linear(x, unpack(p.codes, p.scale, p.offset, n, self.buffer))
        y = x.new_empty(x.shape[0], n)
        for t0 in range(0, tiles, per):
            t1 = min(tiles, t0 + per)
            n0, n1 = t0 * TILE, min(n, t1 * TILE)
            y[:, n0:n1] = F.linear(x, unpack(p.codes[t0:t1], p.scale[t0:t1], p.offset[t0:t1], n1 - n0, self.buffer))
        return y


def int8_factory(exact: bool = False, unpacked: Unpacked | None = None) -> LinearFactory:
    """``unpacked``: the buffer the layers share for their prefill rows (without ``exact``)."""
    return lambda w: WeightOnlyInt8Linear.from_float(w, exact, unpacked)
