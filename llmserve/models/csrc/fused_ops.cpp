// The decoder layer's small steps, each one pass over memory (AVX2 + FMA).
//
// In a decode step every op sees a row or a few: torch's composite RMSNorm (pow, mean, add,
// rsqrt, two muls), rotate-half RoPE (slices, cat, neg, muls, add, per q and k) and the
// KV writes cost ~10 dispatches and ~10 us each per layer, more than their arithmetic.
// Here each is one call, and inputs this small run on the calling thread: waking torch's
// worker threads costs more than the work (and a scheduler quantum on a busy machine).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "simd.h"

namespace {

using llmserve::exp256;
using llmserve::hsum;

constexpr int64_t kRowsPerTask = 16;  // rows of a few hundred floats: below this, one thread

// y = x / sqrt(mean(x^2) + eps) * w, rounded in HF's order: (x * inv) * w.
inline void rms_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = (x[i] * inv) * w[i];
}

void check_rows(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [M, H]");
  TORCH_CHECK(w.dim() == 1 && w.scalar_type() == at::kFloat && w.is_contiguous() && w.size(0) == x.size(1),
              "w must be contiguous float32 [H]");
}

}  // namespace

// x [M, H] -> RMSNorm(x) * w.
at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps) {
  check_rows(x, w);
  auto y = at::empty_like(x);
  const int64_t H = x.size(1);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.size(0), kRowsPerTask, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) rms_row(xp + m * H, wp, yp + m * H, H, static_cast<float>(eps));
  });
  return y;
}

// x += r (the residual stream, in place), then RMSNorm(x) * w.
at::Tensor add_rms_norm_(at::Tensor x, at::Tensor r, at::Tensor w, double eps) {
  check_rows(x, w);
  TORCH_CHECK(r.sizes() == x.sizes() && r.scalar_type() == at::kFloat && r.is_contiguous(), "r must match x");
  auto y = at::empty_like(x);
  const int64_t H = x.size(1);
  float* xp = x.data_ptr<float>();
  const float *rp = r.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.size(0), kRowsPerTask, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      float* xr = xp + m * H;
      const float* rr = rp + m * H;
      for (int64_t i = 0; i < H; ++i) xr[i] += rr[i];
      rms_row(xr, wp, yp + m * H, H, static_cast<float>(eps));
    }
  });
  return y;
}

namespace {

// gu [M, 2I] (gate | up) -> act(gate) * up [M, I]: act8 on 8 lanes, act1 on the tail.
template <class Act8, class Act1>
at::Tensor gate_mul(const at::Tensor& gu, Act8 act8, Act1 act1) {
  TORCH_CHECK(gu.dim() == 2 && gu.scalar_type() == at::kFloat && gu.is_contiguous() && gu.size(1) % 2 == 0,
              "gu must be contiguous float32 [M, 2I]");
  const int64_t M = gu.size(0), I = gu.size(1) / 2;
  auto y = at::empty({M, I}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, kRowsPerTask / 4, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float *g = gp + m * 2 * I, *u = g + I;
      float* out = yp + m * I;
      int64_t i = 0;
      for (; i + 8 <= I; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(act8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
      for (; i < I; ++i) out[i] = act1(g[i]) * u[i];
    }
  });
  return y;
}

}  // namespace

// SwiGLU's gate: silu(g) = g / (1 + e^-g).
at::Tensor silu_mul(at::Tensor gu) {
  return gate_mul(
      gu,
      [](__m256 g) { return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), g)))); },
      [](float g) { return g / (1.f + std::exp(-g)); });
}

// GeGLU's gate (Gemma), GELU's tanh form: 0.5 g (1 + tanh(z)), z = sqrt(2 / pi) (g + 0.044715 g^3),
// taken as g / (1 + e^-2z), the same value without 1 + tanh's cancellation where g < 0 (there
// torch's form loses digits).
at::Tensor gelu_tanh_mul(at::Tensor gu) {
  constexpr float kTwoBeta = 2 * 0.7978845608028654f, kKappa = 0.044715f;
  return gate_mul(
      gu,
      [](__m256 g) {
        const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
        const __m256 z2 = _mm256_mul_ps(_mm256_set1_ps(-kTwoBeta), _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(kKappa), g3)));
        return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp256(z2)));
      },
      [](float g) { return g / (1.f + std::exp(-kTwoBeta * (g + kKappa * g * g * g))); });
}

// qkv [T, (H + 2 KVH) D]: RMSNorm over each q head (weights qw [D]) and each k head (kw [D]),
// in place (Qwen3's and Gemma 3's q / k norms); v is left as it is.
void qk_norm_(at::Tensor qkv, at::Tensor qw, at::Tensor kw, int64_t H, int64_t KVH, double eps) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32");
  const int64_t D = qw.numel(), T = qkv.size(0), width = qkv.size(1);
  TORCH_CHECK(qw.dim() == 1 && kw.dim() == 1 && kw.numel() == D && qw.scalar_type() == at::kFloat &&
                  kw.scalar_type() == at::kFloat && qw.is_contiguous() && kw.is_contiguous() &&
                  width == (H + 2 * KVH) * D, "qw, kw must be contiguous float32 [D] and qkv [T, (H + 2 KVH) D]");
  float* base = qkv.data_ptr<float>();
  const float *qp = qw.data_ptr<float>(), *kp = kw.data_ptr<float>();
  at::parallel_for(0, T, kRowsPerTask, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H + KVH; ++h) {
        float* x = base + t * width + h * D;
        rms_row(x, h < H ? qp : kp, x, D, static_cast<float>(eps));  // (reads x before it writes it)
      }
  });
}

// n float32 values to IEEE half, round to nearest even (F16C where n allows).
static void to_half(const float* x, at::Half* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) out[i] = static_cast<at::Half>(x[i]);
}

// qkv [T, (H + 2 KVH) D]: rotates the q and k heads in place (HF's rotate-half RoPE, the
// tables cos, sin [P, D] indexed by positions [T]) and writes each token's k and v heads
// to row slots[t] of k_cache, v_cache [S, KVH, D]. The q heads stay in qkv for attention.
void rope_and_cache_(at::Tensor qkv, at::Tensor positions, at::Tensor cos, at::Tensor sin,
                     at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots, int64_t H, int64_t KVH) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.dim() == 2, "cos, sin must be float32 [P, D]");
  const auto ct = k_cache.scalar_type();
  TORCH_CHECK((ct == at::kFloat || ct == at::kHalf) && v_cache.scalar_type() == ct && k_cache.is_contiguous() &&
                  v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes(),
              "caches must be contiguous float32 or float16 [S, KVH, D], both the same");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slots.scalar_type() == at::kLong &&
                  positions.is_contiguous() && slots.is_contiguous(), "positions and slots must be contiguous int64");
  const int64_t T = qkv.size(0), D = cos.size(1), half = D / 2, P = cos.size(0), S = k_cache.size(0);
  TORCH_CHECK(qkv.size(1) == (H + 2 * KVH) * D && k_cache.size(1) == KVH && k_cache.size(2) == D && D % 2 == 0,
              "head shapes do not match");
  TORCH_CHECK(positions.numel() == T && slots.numel() == T, "one position and one slot per token");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < P && sl[t] >= 0 && sl[t] < S, "position or slot out of range");
  float* base = qkv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  const bool half_cache = ct == at::kHalf;
  float* kc = half_cache ? nullptr : k_cache.data_ptr<float>();
  float* vc = half_cache ? nullptr : v_cache.data_ptr<float>();
  at::Half* kh = half_cache ? k_cache.data_ptr<at::Half>() : nullptr;
  at::Half* vh = half_cache ? v_cache.data_ptr<at::Half>() : nullptr;
  const int64_t width = (H + 2 * KVH) * D;
  at::parallel_for(0, T, kRowsPerTask, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = base + t * width;
      const float *c = cp + pos[t] * D, *s = sp + pos[t] * D;
      for (int64_t h = 0; h < H + KVH; ++h) {  // q heads, then k heads
        float* x = row + h * D;
        // out = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1); products rounded
        // separately, as torch does (the build turns off FMA contraction)
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c[i] + (-x2) * s[i];
          x[i + half] = x2 * c[i + half] + x1 * s[i + half];
        }
      }
      const float *k = row + H * D, *v = row + (H + KVH) * D;
      if (half_cache) {  // round to nearest even, as torch's .to(float16)
        to_half(k, kh + sl[t] * KVH * D, KVH * D);
        to_half(v, vh + sl[t] * KVH * D, KVH * D);
      } else {
        std::copy(k, k + KVH * D, kc + sl[t] * KVH * D);
        std::copy(v, v + KVH * D, vc + sl[t] * KVH * D);
      }
    }
  });
}

namespace {

constexpr int64_t kArgmaxRowsPerTask = 8;  // a vocabulary row is ~10 us: 8 of them pay a thread's wake-up

// The index of the first NaN, else of the first maximum: torch.argmax's choice.
int64_t argmax_scalar(const float* row, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (row[i] > row[best] || (std::isnan(row[i]) && !std::isnan(row[best]))) best = i;
  return best;
}

// The same, 32 floats a step: lane l keeps the largest of the indices = l mod 32 and the first
// index holding it (strictly greater replaces), then the lanes' largest with the smallest
// index wins. A row with a NaN (seen by an unordered compare) goes to the scalar scan.
int64_t argmax_row(const float* row, int64_t V) {
  if (V < 64) return argmax_scalar(row, V);
  __m256 mx[4], nan = _mm256_setzero_ps();
  __m256i ix[4], pos[4];
  const __m256i step = _mm256_set1_epi32(32);
  for (int a = 0; a < 4; ++a) {
    mx[a] = _mm256_loadu_ps(row + 8 * a);
    pos[a] = ix[a] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * a));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(mx[a], mx[a], _CMP_UNORD_Q));
  }
  int64_t i = 32;
  for (; i + 32 <= V; i += 32)
    for (int a = 0; a < 4; ++a) {
      const __m256 v = _mm256_loadu_ps(row + i + 8 * a);
      pos[a] = _mm256_add_epi32(pos[a], step);
      const __m256 gt = _mm256_cmp_ps(v, mx[a], _CMP_GT_OQ);
      mx[a] = _mm256_blendv_ps(mx[a], v, gt);
      ix[a] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(ix[a]), _mm256_castsi256_ps(pos[a]), gt));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
  if (_mm256_movemask_ps(nan)) return argmax_scalar(row, V);
  alignas(32) float val[32];
  alignas(32) int32_t idx[32];
  for (int a = 0; a < 4; ++a) {
    _mm256_store_ps(val + 8 * a, mx[a]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 8 * a), ix[a]);
  }
  int64_t best = idx[0];
  float top = val[0];
  for (int l = 1; l < 32; ++l)
    if (val[l] > top || (val[l] == top && idx[l] < best)) top = val[l], best = idx[l];
  for (; i < V; ++i) {  // the tail, after every vector index: strictly greater, or its first NaN
    if (std::isnan(row[i])) return i;
    if (row[i] > top) top = row[i], best = i;
  }
  return best;
}

}  // namespace

// Greedy sampling: each row's argmax (torch.argmax's choice), a few rows a thread; torch's
// reduction wakes its worker threads for a single 49k-float row.
at::Tensor argmax_rows(at::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [M, V]");
  const int64_t M = x.size(0), V = x.size(1);
  TORCH_CHECK(V > 0, "rows must not be empty");
  auto out = at::empty({M}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, M, kArgmaxRowsPerTask, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) op[m] = argmax_row(xp + m * V, V);
  });
  return out;
}
