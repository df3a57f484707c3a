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
constexpr int64_t kRows = 4;             // rows sharing each load of an A row

// h[i] = x[i] . A for up to kRows rows of x (stride d): A is loaded once for all of them, and
// two accumulators a row hide the FMA latency.
template <int N, class T>
inline void dots(const float* x, const T* A, int64_t d, float* h, int64_t hstride) {
  __m256 acc[N][2];
  for (int i = 0; i < N; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= d; k += 16) {
    const __m256 a0 = llmserve::load8(A + k), a1 = llmserve::load8(A + k + 8);
    for (int i = 0; i < N; ++i) {
      acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * d + k), a0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * d + k + 8), a1, acc[i][1]);
    }
  }
  for (; k + 8 <= d; k += 8) {
    const __m256 a0 = llmserve::load8(A + k);
    for (int i = 0; i < N; ++i) acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * d + k), a0, acc[i][0]);
  }
  for (int i = 0; i < N; ++i) {
    float s = llmserve::hsum(_mm256_add_ps(acc[i][0], acc[i][1]));
    for (int64_t t = k; t < d; ++t) s += x[i * d + t] * static_cast<float>(A[t]);
    h[i * hstride] = s;
  }
}

// y[c0:c1] += sum_k h[k] * B[k, c0:c1] for k < r: y stays in registers across the r rows of B
// (32 columns at a time), so it is read and written once, not r times.
template <class T>
inline void rank_update(float* y, const float* h, const T* B, int64_t ldb, int64_t r, int64_t c0, int64_t c1) {
  int64_t c = c0;
  for (; c + 32 <= c1; c += 32) {
    __m256 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_loadu_ps(y + c + 8 * j);
    for (int64_t k = 0; k < r; ++k) {
      const __m256 hk = _mm256_set1_ps(h[k]);
      const T* b = B + k * ldb + c;
      for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(hk, llmserve::load8(b + 8 * j), acc[j]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + c + 8 * j, acc[j]);
  }
  for (; c + 8 <= c1; c += 8) {
    __m256 acc = _mm256_loadu_ps(y + c);
    for (int64_t k = 0; k < r; ++k) acc = _mm256_fmadd_ps(_mm256_set1_ps(h[k]), llmserve::load8(B + k * ldb + c), acc);
    _mm256_storeu_ps(y + c, acc);
  }
  for (; c < c1; ++c) {
    float s = y[c];
    for (int64_t k = 0; k < r; ++k) s += h[k] * static_cast<float>(B[k * ldb + c]);
    y[c] = s;
  }
}

struct Segment {
  int64_t slot, r0, n, tot, h0;  // its slot, rows r0..r0+n, A rows used, where its h starts
};

// Two parallel passes over all segments together (h = x A.T, then y += h B): a thread fork per
// pass, not per segment. W: the factors' storage (float or at::Half).
template <class W>
void sgmv(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, const at::Tensor& parts,
          const at::Tensor& segs) {
  const int64_t T = x.size(0), IN = x.size(1), OUT = y.size(1), GR = a.size(1), R = b.size(1), G = parts.size(1);
  const int64_t slots = a.size(0);
  const float* xp = x.data_ptr<float>();
  const W *ap = a.data_ptr<W>(), *bp = b.data_ptr<W>();
  float* yp = y.data_ptr<float>();
  const int64_t *pp = parts.data_ptr<int64_t>(), *sp = segs.data_ptr<int64_t>();

  // The segments with work, checked before any thread starts (a TORCH_CHECK inside a parallel
  // region would be rethrown, but only after the other threads ran on bad offsets).
  std::vector<Segment> work;
  int64_t hsize = 0, ajobs = 0, bjobs = 0;
  const int64_t chunks = (OUT + kChunk - 1) / kChunk;
  for (int64_t s = 0; s < segs.size(0); ++s) {
    const int64_t slot = sp[3 * s], r0 = sp[3 * s + 1], n = sp[3 * s + 2] - r0;
    TORCH_CHECK(slot >= 0 && slot < slots && r0 >= 0 && n >= 0 && r0 + n <= T, "lora_sgmv_: segment out of range");
    const int64_t* part = pp + slot * G * 4;
    int64_t tot = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t lo = part[4 * g], r = part[4 * g + 1], start = part[4 * g + 2], stop = part[4 * g + 3];
      if (r <= 0) continue;
      TORCH_CHECK(r <= R && lo >= 0 && 0 <= start && start <= stop && stop <= OUT, "lora_sgmv_: part beyond B");
      tot = std::max(tot, lo + r);
    }
    if (tot == 0 || n == 0) continue;
    TORCH_CHECK(tot <= GR, "lora_sgmv_: parts beyond A");
    work.push_back({slot, r0, n, tot, hsize});
    hsize += n * tot;
    ajobs += tot * ((n + kRows - 1) / kRows);
    bjobs += chunks;
  }
  if (work.empty()) return;
  std::vector<float> h(hsize);
  const int64_t avg_n = std::max<int64_t>(1, T / static_cast<int64_t>(work.size()));

  // Pass 1, jobs (segment, A row j, block of kRows rows): h[i, j] = x[r0 + i] . A[j]
  at::parallel_for(0, ajobs, std::max<int64_t>(1, kWorkPerTask / (kRows * IN)), [&](int64_t j0, int64_t j1) {
    int64_t s = 0, base = 0;
    for (int64_t job = j0; job < j1; ++job) {
      while (true) {  // the segment holding this job (few segments: a walk from the last one)
        const Segment& w = work[s];
        const int64_t count = w.tot * ((w.n + kRows - 1) / kRows);
        if (job < base + count) break;
        base += count;
        ++s;
      }
      const Segment& w = work[s];
      const int64_t blocks = (w.n + kRows - 1) / kRows, j = (job - base) / blocks, i0 = (job - base) % blocks * kRows;
      const float* xi = xp + (w.r0 + i0) * IN;
      const W* A = ap + (w.slot * GR + j) * IN;
      float* hi = h.data() + w.h0 + i0 * w.tot + j;
      switch (std::min(kRows, w.n - i0)) {
        case 1: dots<1>(xi, A, IN, hi, w.tot); break;
        case 2: dots<2>(xi, A, IN, hi, w.tot); break;
        case 3: dots<3>(xi, A, IN, hi, w.tot); break;
        default: dots<4>(xi, A, IN, hi, w.tot); break;
      }
    }
  });

  // Pass 2, jobs (segment, chunk of kChunk output columns): y[rows, chunk] += h[:, part] B_part
  at::parallel_for(0, bjobs, std::max<int64_t>(1, kWorkPerTask / (avg_n * kChunk * R)), [&](int64_t j0, int64_t j1) {
    for (int64_t job = j0; job < j1; ++job) {
      const Segment& w = work[job / chunks];
      const int64_t cs = job % chunks * kChunk, ce = std::min(OUT, cs + kChunk);
      const int64_t* part = pp + w.slot * G * 4;
      const W* B = bp + w.slot * R * OUT;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t lo = part[4 * g], r = part[4 * g + 1];
        const int64_t s0 = std::max(cs, part[4 * g + 2]), s1 = std::min(ce, part[4 * g + 3]);
        if (r <= 0 || s0 >= s1) continue;
        for (int64_t i = 0; i < w.n; ++i)
          rank_update(yp + (w.r0 + i) * OUT, h.data() + w.h0 + i * w.tot + lo, B, OUT, r, s0, s1);
      }
    }
  });
}

}  // namespace

// y [T, out] += per segment; x [T, in]; a [slots, GR, in] (each slot's modules' A rows packed);
// b [slots, R, out] (module g's B.T at rows 0..r_g, its columns start_g..stop_g);
// parts [slots, G, 4] int64 (lo, r, start, stop; r = 0: the module is absent); segs [S, 3] int64
// (slot, first row, end row). All contiguous; y, x float32; a, b float32 or both float16
// (widened as they are read: the factors' reads are most of this product's cost).
void lora_sgmv_(at::Tensor y, at::Tensor x, at::Tensor a, at::Tensor b, at::Tensor parts, at::Tensor segs) {
  TORCH_CHECK(y.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat, "lora_sgmv_: float32 x and y");
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && (a.scalar_type() == at::kFloat || a.scalar_type() == at::kHalf),
              "lora_sgmv_: a and b both float32 or both float16");
  TORCH_CHECK(parts.scalar_type() == at::kLong && segs.scalar_type() == at::kLong, "lora_sgmv_: int64 parts, segs");
  TORCH_CHECK(y.is_contiguous() && x.is_contiguous() && a.is_contiguous() && b.is_contiguous() &&
                  parts.is_contiguous() && segs.is_contiguous(), "lora_sgmv_: contiguous tensors");
  TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && x.size(0) == y.size(0) && a.dim() == 3 && a.size(2) == x.size(1) &&
                  b.dim() == 3 && b.size(2) == y.size(1) && parts.dim() == 3 && parts.size(2) == 4 &&
                  segs.dim() == 2 && segs.size(1) == 3, "lora_sgmv_: shapes");
  if (a.scalar_type() == at::kHalf) sgmv<at::Half>(y, x, a, b, parts, segs);
  else sgmv<float>(y, x, a, b, parts, segs);
}
