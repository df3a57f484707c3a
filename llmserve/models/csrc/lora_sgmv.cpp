// LoRA's gathered low-rank products (Punica / S-LoRA's SGMV) for one product of a step, in one call.
//
// Each segment of consecutive rows on one slot gets y[rows, cols] += (x[rows] @ A_slot.T)[:, part] @ B_slot
// for every module (part) of the slot's adapter in this product. In Python that is ~3-10 small
// torch ops per segment and product, a few thousand a step at ~5-30 us each: more than the
// arithmetic (the 12 adapter rows of a 16-row SmolLM2 step are ~60 M multiply-adds in all).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "simd.h"

namespace {

constexpr int64_t kWorkPerTask = 65536;  // multiply-adds below which a task is not worth a thread
constexpr int64_t kChunk = 64;           // output columns per task of the B product

inline void axpy(float* y, float c, const float* b, int64_t d) {
  const __m256 cv = _mm256_set1_ps(c);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(cv, _mm256_loadu_ps(b + i), _mm256_loadu_ps(y + i)));
  for (; i < d; ++i) y[i] += c * b[i];
}

}  // namespace

// y [T, out] += per segment; x [T, in]; a [slots, GR, in] (each slot's modules' A rows packed);
// b [slots, R, out] (module g's B.T at rows 0..r_g, its columns start_g..stop_g);
// parts [slots, G, 4] int64 (lo, r, start, stop; r = 0: the module is absent); segs [S, 3] int64
// (slot, first row, end row). All contiguous; y, x, a, b float32.
void lora_sgmv_(at::Tensor y, at::Tensor x, at::Tensor a, at::Tensor b, at::Tensor parts, at::Tensor segs) {
  TORCH_CHECK(y.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat && a.scalar_type() == at::kFloat &&
                  b.scalar_type() == at::kFloat, "lora_sgmv_: float32 tensors");
  TORCH_CHECK(parts.scalar_type() == at::kLong && segs.scalar_type() == at::kLong, "lora_sgmv_: int64 parts, segs");
  TORCH_CHECK(y.is_contiguous() && x.is_contiguous() && a.is_contiguous() && b.is_contiguous() &&
                  parts.is_contiguous() && segs.is_contiguous(), "lora_sgmv_: contiguous tensors");
  TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && x.size(0) == y.size(0) && a.dim() == 3 && a.size(2) == x.size(1) &&
                  b.dim() == 3 && b.size(2) == y.size(1) && parts.dim() == 3 && parts.size(2) == 4 &&
                  segs.dim() == 2 && segs.size(1) == 3, "lora_sgmv_: shapes");
  const int64_t T = x.size(0), IN = x.size(1), OUT = y.size(1), GR = a.size(1), R = b.size(1), G = parts.size(1);
  const int64_t slots = a.size(0);
  const float *xp = x.data_ptr<float>(), *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t *pp = parts.data_ptr<int64_t>(), *sp = segs.data_ptr<int64_t>();
  std::vector<float> h;
  for (int64_t s = 0; s < segs.size(0); ++s) {
    const int64_t slot = sp[3 * s], r0 = sp[3 * s + 1], n = sp[3 * s + 2] - r0;
    TORCH_CHECK(slot >= 0 && slot < slots && r0 >= 0 && n >= 0 && r0 + n <= T, "lora_sgmv_: segment out of range");
    const int64_t* part = pp + slot * G * 4;
    int64_t tot = 0;
    for (int64_t g = 0; g < G; ++g)
      if (part[4 * g + 1] > 0) tot = std::max(tot, part[4 * g] + part[4 * g + 1]);
    if (tot == 0 || n == 0) continue;
    TORCH_CHECK(tot <= GR, "lora_sgmv_: parts beyond A");
    h.assign(n * tot, 0.f);
    const float* A = ap + slot * GR * IN;
    // h[i, j] = x[r0 + i] . A[j]: each A row read once for the segment's rows
    at::parallel_for(0, tot, std::max<int64_t>(1, kWorkPerTask / (n * IN)), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = 0; i < n; ++i) h[i * tot + j] = llmserve::dot(xp + (r0 + i) * IN, A + j * IN, IN);
    });
    const float* B = bp + slot * R * OUT;
    const int64_t chunks = (OUT + kChunk - 1) / kChunk;
    at::parallel_for(0, chunks, std::max<int64_t>(1, kWorkPerTask / (n * kChunk * std::max<int64_t>(1, tot))),
                     [&](int64_t c0, int64_t c1) {
      const int64_t cs = c0 * kChunk, ce = std::min(OUT, c1 * kChunk);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t lo = part[4 * g], r = part[4 * g + 1];
        const int64_t s0 = std::max(cs, part[4 * g + 2]), s1 = std::min(ce, part[4 * g + 3]);
        if (r == 0 || s0 >= s1) continue;
        TORCH_CHECK(r <= R && lo + r <= tot, "lora_sgmv_: part beyond B");
        for (int64_t i = 0; i < n; ++i) {
          float* yrow = yp + (r0 + i) * OUT;
          for (int64_t k = 0; k < r; ++k) axpy(yrow + s0, h[i * tot + lo + k], B + k * OUT + s0, s1 - s0);
        }
      }
    });
  }
}
