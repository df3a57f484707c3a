// Decode attention straight over the paged KV pool, for x86 CPUs with AVX2 + FMA.
//
// One query token per sequence (a decode step): for each sequence and query head, the
// scores against its context's keys, read where they lie in the pool (no gathered copy of
// the context, which torch's SDPA would need: 11 % of a batch-64 step before), a softmax,
// and the weighted sum of the values. Grouped-query attention: query head h reads KV head
// h / (H / KVH).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "simd.h"

namespace {

using llmserve::dot;

inline void axpy(float a, const float* x, float* y, int64_t d) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < d; ++i) y[i] += a * x[i];
}

}  // namespace

// q [B, H, D]; k_cache, v_cache [S, KVH, D]; kv_index [B, L] slot of each context position
// (padded); lens [B] context lengths -> [B, H, D]. All float32 except the int64 indices.
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                     at::Tensor kv_index, at::Tensor lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat, "q must be float32 [B, H, D]");
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat &&
                  k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous float32");
  TORCH_CHECK(kv_index.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "indices must be int64");
  q = q.contiguous();
  kv_index = kv_index.contiguous();
  lens = lens.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(1), L = kv_index.size(1);
  TORCH_CHECK(H % KVH == 0 && k_cache.size(2) == D, "head shapes do not match");
  const int64_t rep = H / KVH;
  auto out = at::zeros({B, H, D}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k_cache.data_ptr<float>(), *vp = v_cache.data_ptr<float>();
  const int64_t *ip = kv_index.data_ptr<int64_t>(), *lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * KVH, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores(static_cast<size_t>(rep * L));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / KVH, kh = w % KVH, n = std::min(lp[b], L);
      const int64_t* slots = ip + b * L;
      // Scores of the rep query heads sharing this KV head: each key is read once.
      for (int64_t t = 0; t < n; ++t) {
        const float* key = kp + (slots[t] * KVH + kh) * D;
        for (int64_t r = 0; r < rep; ++r) scores[r * L + t] = dot(qp + (b * H + kh * rep + r) * D, key, D) * sc;
      }
      for (int64_t r = 0; r < rep; ++r) {
        float* s = scores.data() + r * L;
        float mx = -INFINITY;
        for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) sum += (s[t] = std::exp(s[t] - mx));
        const float inv = n > 0 ? 1.f / sum : 0.f;
        for (int64_t t = 0; t < n; ++t) s[t] *= inv;
      }
      for (int64_t t = 0; t < n; ++t) {
        const float* val = vp + (slots[t] * KVH + kh) * D;
        for (int64_t r = 0; r < rep; ++r) axpy(scores[r * L + t], val, op + (b * H + kh * rep + r) * D, D);
      }
    }
  });
  return out;
}
