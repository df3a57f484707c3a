// Decode attention straight over the paged KV pool, for x86 CPUs with AVX2 + FMA.
//
// One query token per sequence (a decode step): for each sequence and query head, the
// scores against its context's keys, read where they lie in the pool (no gathered copy of
// the context, which torch's SDPA would need), a softmax, and the weighted sum of the
// values. Grouped-query attention: query head h reads KV head h / (H / KVH), and the heads
// sharing a KV head are done together, so each key and value is read from memory once.
//
// The pool holds float32 or float16 (IEEE half, widened with F16C as it is read: half the
// bytes to stream, the same arithmetic in float32).
//
// At batch 64 this reads every context of the batch once per layer, so it has to run
// near memory speed: scores are taken 8 keys at a time (one horizontal sum per 8 keys,
// not per key), the softmax uses a vector exp, and the weighted sum keeps its
// accumulators in registers across the context (32 dims of up to 3 heads per pass).
// Memory latency, not bandwidth, bound it (a context already in L2 ran 3.5x faster), so
// each work item asks for what comes next into L2 while it computes: its values while it
// scores, the next item's keys and values while it sums its own values.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {

using llmserve::exp256;
using llmserve::hsum;
using llmserve::load8;

template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {  // d a multiple of 8
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), acc);
  return hsum(acc);
}

// The 8 horizontal sums of a[0..7], as one vector.
inline __m256 hsum8(const __m256* a) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  // lanes: [0 1 2 3 | 0 1 2 3] halves of (0123) and (4567): add the 128-bit halves
  const __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20), hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
  return _mm256_add_ps(lo, hi);
}

// scores[t] = scale * q . key(t) for t < n; D a multiple of 8.
// ``vals`` (or null): on fp16 pools their rows are asked for into L2 as the keys' are into L1.
template <typename T>
void scores_of(const float* q, const T* const* keys, int64_t n, int64_t D, float scale, float* scores,
               const T* const* vals) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    // the next 8 keys' rows, asked for now: contexts lie in scattered blocks, where the
    // hardware prefetcher loses the stream at every block's end (fp16 rows: 0.86-0.94x the
    // time over a batch of 64; fp32 rows, twice the lines, ran 1.02-1.07x, so not there)
    if constexpr (sizeof(T) == 2)
      for (int64_t i = t + 8; i < std::min(t + 16, n); ++i)
        for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(keys[i]) + b, _MM_HINT_T0);
          if (vals) _mm_prefetch(reinterpret_cast<const char*>(vals[i]) + b, _MM_HINT_T1);
        }
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j += 8) {
      const __m256 qv = _mm256_loadu_ps(q + j);
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(keys[t + i] + j), acc[i]);
    }
    _mm256_storeu_ps(scores + t, _mm256_mul_ps(hsum8(acc), sc));
  }
  for (; t < n; ++t) scores[t] = dot(q, keys[t], D) * scale;
}

// scores[0..n) <- softmax(scores[0..n)).
void softmax(float* s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), m));
    _mm256_storeu_ps(s + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; t < n; ++t) sum += (s[t] = std::exp(s[t] - mx));
  const float inv = n > 0 ? 1.f / sum : 0.f;
  for (t = 0; t < n; ++t) s[t] *= inv;
}

// Rows the next work item reads (its keys' and values'), asked for into L2 ``per`` at a
// time, one batch for each of this item's values.
template <typename T>
struct Ahead {
  const T* const* rows;
  int64_t n, per, bytes;
};

// out[r][c0 .. c0 + 8 NV) = sum_t p[r][t] value(t)[c0 ..] for R heads; accumulators stay in registers.
template <int R, int NV, typename T>
void weighted_values(const float* const* p, const T* const* vals, int64_t n, int64_t c0, float* const* out,
                     int64_t rest, const Ahead<T>* ahead) {
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const T* v = vals[t] + c0;
    // The first pass over a row's leading 32 dims asks for the rest of the row too (the
    // later passes' cache lines): fetched together, the row costs one memory round trip.
    for (int64_t b = 32 * static_cast<int64_t>(sizeof(T)); b < rest; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(v) + b, _MM_HINT_T0);
    if (rest > 0 && t + 4 < n)  // and a row 4 ahead, as the keys' (above)
      for (int64_t b = 0; b < rest; b += 64) _mm_prefetch(reinterpret_cast<const char*>(vals[t + 4] + c0) + b, _MM_HINT_T0);
    if (ahead)
      for (int64_t i = t * ahead->per; i < std::min((t + 1) * ahead->per, ahead->n); ++i)
        for (int64_t b = 0; b < ahead->bytes; b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(ahead->rows[i]) + b, _MM_HINT_T1);
    __m256 w[R];
    for (int r = 0; r < R; ++r) w[r] = _mm256_set1_ps(p[r][t]);
    for (int j = 0; j < NV; ++j) {
      const __m256 x = load8(v + 8 * j);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(w[r], x, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out[r] + c0 + 8 * j, acc[r][j]);
}

template <int R, typename T>
void weighted_values_chunk(const float* const* p, const T* const* vals, int64_t n, int64_t c0, int64_t nv,
                           float* const* out, int64_t rest, const Ahead<T>* ahead) {
  switch (nv) {
    case 1: weighted_values<R, 1>(p, vals, n, c0, out, rest, ahead); break;
    case 2: weighted_values<R, 2>(p, vals, n, c0, out, rest, ahead); break;
    case 3: weighted_values<R, 3>(p, vals, n, c0, out, rest, ahead); break;
    default: weighted_values<R, 4>(p, vals, n, c0, out, rest, ahead); break;
  }
}

template <typename T>
void decode(const float* qp, const T* kp, const T* vp, const int64_t* ip, const int64_t* lp, float* op, int64_t B,
            int64_t H, int64_t KVH, int64_t D, int64_t L, float sc) {
  const int64_t rep = H / KVH;
  at::parallel_for(0, B * KVH, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores(static_cast<size_t>(rep * L));
    std::vector<const T*> keys(static_cast<size_t>(L)), vals(static_cast<size_t>(L)), next(static_cast<size_t>(2 * L));
    std::vector<const float*> probs(static_cast<size_t>(rep));
    std::vector<float*> outs(static_cast<size_t>(rep));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / KVH, kh = w % KVH, n = std::min(lp[b], L);
      const int64_t* slots = ip + b * L;
      for (int64_t t = 0; t < n; ++t) {
        keys[t] = kp + (slots[t] * KVH + kh) * D;
        vals[t] = vp + (slots[t] * KVH + kh) * D;
      }
      // the next item's rows, keys and values alternating (with the values' prefetch above: a
      // batch-64 layer in 0.65-0.77x the time at contexts 136-256 on a Zen 4 EPYC, fp16 or fp32)
      Ahead<T> ahead{next.data(), 0, 1, D * static_cast<int64_t>(sizeof(T))};
      if (w + 1 < w1) {
        const int64_t b2 = (w + 1) / KVH, kh2 = (w + 1) % KVH, n2 = std::min(lp[b2], L);
        for (int64_t t = 0; t < n2; ++t) {
          next[2 * t] = kp + (ip[b2 * L + t] * KVH + kh2) * D;
          next[2 * t + 1] = vp + (ip[b2 * L + t] * KVH + kh2) * D;
        }
        ahead.n = 2 * n2;
        ahead.per = n > 0 ? (ahead.n + n - 1) / n : 0;
      }
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t h = kh * rep + r;
        float* s = scores.data() + r * L;
        scores_of(qp + (b * H + h) * D, keys.data(), n, D, sc, s, r == 0 ? vals.data() : nullptr);
        softmax(s, n);
        probs[r] = s;
        outs[r] = op + (b * H + h) * D;
      }
      for (int64_t r0 = 0; r0 < rep; r0 += 3) {  // three heads per pass: 12 accumulators + loads fit 16 registers
        const int64_t R = std::min<int64_t>(3, rep - r0);
        for (int64_t c0 = 0; c0 < D; c0 += 32) {
          const int64_t nv = std::min<int64_t>(4, (D - c0) / 8);
          // bytes of the row to prefetch: all of it on the first pass, none after (fp16
          // rows only: 13-15 % faster there; no gain measured on fp32 rows)
          const int64_t rest =
              (std::is_same_v<T, at::Half> && r0 == 0 && c0 == 0) ? D * static_cast<int64_t>(sizeof(T)) : 0;
          const Ahead<T>* a = r0 == 0 && c0 == 0 && ahead.n > 0 ? &ahead : nullptr;
          if (R == 3) weighted_values_chunk<3>(probs.data() + r0, vals.data(), n, c0, nv, outs.data() + r0, rest, a);
          else if (R == 2) weighted_values_chunk<2>(probs.data() + r0, vals.data(), n, c0, nv, outs.data() + r0, rest, a);
          else weighted_values_chunk<1>(probs.data() + r0, vals.data(), n, c0, nv, outs.data() + r0, rest, a);
        }
      }
    }
  });
}

}  // namespace

// q [B, H, D]; k_cache, v_cache [S, KVH, D] (float32 or float16, the same); kv_index [B, L]
// slot of each context position (padded); lens [B] context lengths -> [B, H, D] float32.
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                  at::Tensor kv_index, at::Tensor lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat, "q must be float32 [B, H, D]");
  const auto kt = k_cache.scalar_type();
  TORCH_CHECK((kt == at::kFloat || kt == at::kHalf) && v_cache.scalar_type() == kt && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(), "caches must be contiguous float32 or float16, both the same");
  TORCH_CHECK(kv_index.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "indices must be int64");
  q = q.contiguous();
  kv_index = kv_index.contiguous();
  lens = lens.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(1), L = kv_index.size(1);
  const int64_t S = k_cache.size(0);
  TORCH_CHECK(H % KVH == 0 && k_cache.size(2) == D && D % 8 == 0, "head shapes do not match (or D % 8 != 0)");
  TORCH_CHECK(lens.numel() == B && kv_index.size(0) == B, "one context length and index row per sequence");
  auto out = at::zeros({B, H, D}, q.options());
  const int64_t *ip = kv_index.data_ptr<int64_t>(), *lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = std::min(lp[b], L);
    for (int64_t t = 0; t < n; ++t) TORCH_CHECK(ip[b * L + t] >= 0 && ip[b * L + t] < S, "slot out of range");
  }
  const float sc = static_cast<float>(scale);
  if (kt == at::kHalf)
    decode(q.data_ptr<float>(), k_cache.data_ptr<at::Half>(), v_cache.data_ptr<at::Half>(), ip, lp,
           out.data_ptr<float>(), B, H, KVH, D, L, sc);
  else
    decode(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), ip, lp, out.data_ptr<float>(),
           B, H, KVH, D, L, sc);
  return out;
}
