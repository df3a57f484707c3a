// The activations of the int8 products (qdot_linear.cpp), quantised per 32 on every thread:
// one byte (8 or 7 bits), or two (fine); the outlier channels kept aside in fp32.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "qdot_rows.h"
#include "simd.h"

namespace {  // internal linkage: only qdot_linear.cpp builds it

using llmserve::hsum;
using llmserve::qdot::kGroup;

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
  return _mm_cvtsi128_si32(x);
}

// A vector whose elements start uninitialised: every byte of q and r is written once by the
// quantisation, so zeroing them first is a pass over [M, K] for nothing (on the calling thread,
// while the others wait).
template <class T>
struct Uninit : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = Uninit<U>;
  };
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};

// M rows of x quantised per 32: x ~ xd * q, q = round(x / xd) in -127..127, xd = absmax / 127.
// Fine: also the rounding's residual, x ~ xd * (q + r / 128) with r in -64..64 (15-bit
// activations in two bytes, each a maddubs operand). Per group [M, G]: the unit u of the
// products (xd, or xd / 128 when fine), the exact sum xs, and c = 7.5 e for e = xs - u * sum(X),
// X = q (or 128 q + r), what rounding took from the sum: the 4-bit codes' centring term (Q4).
//
// Outlier channels (``chans``, the same for every row, chosen per layer by
// llmserve/models/outliers.py): x's values there are kept aside in fp32 (xo [M, ko]) and
// count as 0 in their groups, so that a few large channels do not coarsen the rounding of
// the rest; the kernels add their products, on their weights in float16 (half the bytes a
// one-row step streams for them), after the groups' sums.
// Seven bits (not fine): q in -63..63, xd = absmax / 63, and each group's sum of q kept (n).
struct Acts {
  int64_t K, G, ko;
  std::vector<int8_t, Uninit<int8_t>> q, r;  // [M, K]; r only when fine
  std::vector<float> u, s, c, xo;
  std::vector<int32_t> n;  // [M, G] sums of q, seven bits only

  Acts(const float* x, int64_t M, int64_t K_, bool fine, const int64_t* chans = nullptr, int64_t ko_ = 0,
       int bits = 8)
      : K(K_), G(K_ / kGroup), ko(ko_), q(M * K_), r(fine ? M * K_ : 0), u(M * G), s(M * G), c(M * G),
        xo(M * ko_), n(bits == 7 ? M * G : 0) {
    const float top = bits == 7 ? 63.f : 127.f;
    // The outlier channels by group: group g's are chans[by[from[g]]] .. chans[by[from[g + 1] - 1]]
    // (ko is a few dozen); each group holding any is copied less them as it is quantised, not
    // the whole of x first.
    std::vector<int64_t> from(G + 1, 0), by(ko);
    for (int64_t j = 0; j < ko; ++j) ++from[chans[j] / kGroup + 1];
    for (int64_t g = 0; g < G; ++g) from[g + 1] += from[g];
    std::vector<int64_t> fill(from.begin(), from.end() - 1);
    for (int64_t j = 0; j < ko; ++j) by[fill[chans[j] / kGroup]++] = j;
    const __m256 sign = _mm256_set1_ps(-0.f);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    // Groups are independent: a prefill chunk's hundreds of rows are split over the threads
    // rather than quantised on one while the others wait; a few rows stay on one.
    at::parallel_for(0, M * G, 512, [&](int64_t i0, int64_t i1) {
    alignas(32) float held[kGroup];  // a group less its outlier channels
    // (row m and group g of i, kept in step rather than divided out for every group)
    for (int64_t i = i0, m = i0 / G, g = i0 % G; i < i1; ++i, g = g + 1 < G ? g + 1 : (++m, 0)) {
      const float* xg = x + i * kGroup;
      if (from[g] < from[g + 1]) {
        std::copy(xg, xg + kGroup, held);
        for (int64_t e = from[g]; e < from[g + 1]; ++e) {
          const int64_t j = by[e];
          xo[m * ko + j] = held[chans[j] % kGroup];
          held[chans[j] % kGroup] = 0.f;
        }
        xg = held;
      }
      __m256 v[4], mx = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_loadu_ps(xg + 8 * j);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
        sum = _mm256_add_ps(sum, v[j]);
      }
      const float amax = hmax(mx);
      s[i] = hsum(sum);
      // (127 / amax overflows for denormal groups: those count as zero)
      const __m256 inv = _mm256_set1_ps(amax >= 1e-30f ? top / amax : 0.f);
      __m256i qi[4], f[4];
      for (int j = 0; j < 4; ++j) {
        const __m256 t = _mm256_mul_ps(v[j], inv), rt = _mm256_round_ps(t, kNearest);
        qi[j] = _mm256_cvtps_epi32(rt);
        if (fine) {
          const __m256 residual = _mm256_mul_ps(_mm256_sub_ps(t, rt), _mm256_set1_ps(128.f));  // in -64..64
          f[j] = _mm256_cvtps_epi32(_mm256_round_ps(residual, kNearest));
        }
      }
      int64_t total = hsum(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
      store(qi, q.data() + i * kGroup);
      u[i] = amax / top;
      if (!n.empty()) n[i] = static_cast<int32_t>(total);
      if (fine) {
        total = 128 * total + hsum(_mm256_add_epi32(_mm256_add_epi32(f[0], f[1]), _mm256_add_epi32(f[2], f[3])));
        store(f, r.data() + i * kGroup);
        u[i] /= 128.f;
      }
      c[i] = llmserve::qdot::kQ4Center * (s[i] - u[i] * static_cast<float>(total));
    }
    });
  }

  // 32 int32 codes (in -127..127) as bytes, in order
  static void store(const __m256i (&c)[4], int8_t* out) {
    // the packs work within 128-bit lanes: 4-int blocks come out as 0 2 4 6 1 3 5 7
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), p);
  }
};

}  // namespace
