// Weight-only int8 matrix-vector products for x86 CPUs with AVX2 + FMA.
//
// W[n, k] = q[n, k] * scale[n, g] + offset[n, g] for the group g = k / 32 (int8 codes, one
// affine map per 32 weights, as GGUF's Q8_0 / Q4_1 blocks): y = x @ W^T for a few fp32 rows x.
//
// Decode steps multiply a few rows by every weight of the model, so they are bound by the
// bytes the weights stream from memory: ~1.25 bytes per weight here against fp32's 4.
// Activations stay fp32 (this model's activations have outlier channels that int8
// activation quantisation cannot carry; see the README). Codes are widened to fp32 in
// registers; a group's scale multiplies its partial dot product, and its offset meets the
// group's sum of x, computed once per row. Many rows (prefill, big batches) are
// compute-bound, where int8 codes save nothing on AVX2: the caller uses fp32 weights there.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kRowsPerPass = 8;

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

inline __m256 codes8(const int8_t* w) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}

// y[r, n] for R rows of x and outputs n0..n1; xsum[r, g] = the sum of x[r] over group g.
template <int R>
void rows(const float* x, const float* xsum, const int8_t* q, const float* scale, const float* offset, float* y,
          int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* w = q + n * K;
    const float* sc = scale + n * G;
    const float* of = offset + n * G;
    __m256 acc[R];
    float off[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), off[r] = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k = g * kGroup;
      const __m256 w0 = codes8(w + k), w1 = codes8(w + k + 8), w2 = codes8(w + k + 16), w3 = codes8(w + k + 24);
      const __m256 s = _mm256_set1_ps(sc[g]);
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * K + k;
        __m256 p = _mm256_mul_ps(w0, _mm256_loadu_ps(xr));
        p = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), p);
        p = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr + 16), p);
        p = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + 24), p);
        acc[r] = _mm256_fmadd_ps(p, s, acc[r]);
        off[r] += of[g] * xsum[r * G + g];
      }
    }
    for (int r = 0; r < R; ++r) y[r * N + n] = hsum(acc[r]) + off[r];
  }
}

}  // namespace

// x [M, K] float32; q [N, K] int8; scale, offset [N, K / 32] float32 -> [M, N] float32.
torch::Tensor w8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale, torch::Tensor offset) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a 2-D float32 tensor");
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(), "q must be contiguous int8 [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0), G = K / kGroup;
  TORCH_CHECK(q.size(1) == K && K % kGroup == 0, "shapes do not match, or K is not a multiple of 32");
  for (const auto& t : {scale, offset})
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == N * G,
                "scale and offset must be contiguous float32 [N, K / 32]");
  x = x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  std::vector<float> xsum(static_cast<size_t>(M * G));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int64_t k = 0; k < kGroup; ++k) s += xp[m * K + g * kGroup + k];
      xsum[m * G + g] = s;
    }
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *op = offset.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; m += kRowsPerPass) {
      const float* xm = xp + m * K;
      const float* xs = xsum.data() + m * G;
      float* ym = yp + m * N;
      switch (std::min(kRowsPerPass, M - m)) {
        case 1: rows<1>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
        case 2: rows<2>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
        case 3: rows<3>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
        case 4: rows<4>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
        case 5: rows<5>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
        case 6: rows<6>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
        case 7: rows<7>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
        default: rows<8>(xm, xs, qp, sp, op, ym, K, N, n0, n1); break;
      }
    }
  });
  return y;
}
