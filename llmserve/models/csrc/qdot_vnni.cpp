// The int8 products' few-row path on CPUs with AVX-512 VNNI (Zen 4, Ice Lake and later).
//
// A verification step scores 1 + k rows of one request: on AVX2 the kernel goes over a
// tile's codes once per 2 rows (fine) and unpacks them each time, with two instructions
// (maddubs, add) per 32 byte products, so 7 rows cost ~5 one-row products. Here
// vpdpbusd does both in one, and the 32 vector registers hold the accumulators of 4 rows
// (fine: two bytes each) or 8 (one byte): each step's codes are loaded and unpacked once
// for all of them. From 9 rows (decode batches, prefill chunks) two tiles go through each
// pass in 512-bit vectors (pair_rows). The integer sums are exact either way (no int16
// saturation bounds them here), and the float steps are the AVX2 kernel's, in its order:
// the same bits.
//
// Only this file is compiled for AVX-512 (the pragma below, after every include, so no
// header's inline function is built for it); qdot_linear.cpp calls it where the CPU has it.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "qdot_rows.h"

namespace llmserve::qdot {

bool vnni_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

namespace {

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
template <class B>
inline __m256i bcast4(const B* p) { return _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(p)); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// Two tiles' 256-bit pieces as one 512-bit vector (the low half from p0).
inline __m512i load32x2(const uint8_t* p0, const uint8_t* p1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load32(p0)), load32(p1), 1);
}
inline __m512 load16(const float* p0, const float* p1) {
  const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(load8(p0)));
  return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(load8(p1)), 1));
}
inline __m512 load16(const uint16_t* p0, const uint16_t* p1) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
}

// A group's int32 products for a tile and R rows: p[r] (the q bytes), pr[r] (the residual
// bytes, when Fine). One or two rows split each sum over the low and high nibbles (Q4) or
// even and odd steps (Q8): vpdpbusd's latency would otherwise bound so few chains.
// x: q (Four) or q + 128 (8-bit codes), as bytes; xr the same of r.
template <bool Four, int R, bool Fine>
inline void dot(const uint8_t* w, const void* const (&x_)[R], const void* const (&xr_)[R], __m256i (&p)[R],
                __m256i (&pr)[R]) {
  using B = std::conditional_t<Four, int8_t, uint8_t>;
  const B *x[R], *xr[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const B*>(x_[r]), xr[r] = static_cast<const B*>(xr_[r]);
  constexpr bool kSplit = R <= 2;
  __m256i a[R], b[R], c[kSplit ? R : 1], d[kSplit ? R : 1];
  for (int r = 0; r < R; ++r) {
    a[r] = b[r] = _mm256_setzero_si256();
    if constexpr (kSplit) c[r] = d[r] = _mm256_setzero_si256();
  }
  if constexpr (Four) {  // 4 steps of 32 bytes: low nibbles are step 2i, high ones 2i + 1
    const __m256i m = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 4; ++i) {
      const __m256i v = load32(w + 32 * i);
      const __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
      for (int r = 0; r < R; ++r) {
        a[r] = _mm256_dpbusd_epi32(a[r], lo, bcast4(x[r] + 8 * i));
        __m256i& ah = kSplit ? c[kSplit ? r : 0] : a[r];
        ah = _mm256_dpbusd_epi32(ah, hi, bcast4(x[r] + 8 * i + 4));
        if constexpr (Fine) {
          b[r] = _mm256_dpbusd_epi32(b[r], lo, bcast4(xr[r] + 8 * i));
          __m256i& bh = kSplit ? d[kSplit ? r : 0] : b[r];
          bh = _mm256_dpbusd_epi32(bh, hi, bcast4(xr[r] + 8 * i + 4));
        }
      }
    }
  } else {
    // 8 steps of signed codes against x + 128 (unsigned), less 128 times the codes' sums:
    // those are shared by the rows, where |code| against x with code's sign costs a sign
    // instruction a row; |sum| <= 32 * 255 * 128 fits int32
    const __m256i ones = _mm256_set1_epi8(1);
    __m256i sum = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) {
      const __m256i v = load32(w + 32 * s);
      sum = _mm256_dpbusd_epi32(sum, ones, v);
      for (int r = 0; r < R; ++r) {
        __m256i& as = (kSplit && (s & 1)) ? c[kSplit ? r : 0] : a[r];
        as = _mm256_dpbusd_epi32(as, bcast4(x[r] + 4 * s), v);
        if constexpr (Fine) {
          __m256i& bs = (kSplit && (s & 1)) ? d[kSplit ? r : 0] : b[r];
          bs = _mm256_dpbusd_epi32(bs, bcast4(xr[r] + 4 * s), v);
        }
      }
    }
    sum = _mm256_slli_epi32(sum, 7);
    for (int r = 0; r < R; ++r) {
      a[r] = _mm256_sub_epi32(a[r], sum);
      if constexpr (Fine) b[r] = _mm256_sub_epi32(b[r], sum);
    }
  }
  for (int r = 0; r < R; ++r) {
    p[r] = kSplit ? _mm256_add_epi32(a[r], c[kSplit ? r : 0]) : a[r];
    if constexpr (Fine) pr[r] = kSplit ? _mm256_add_epi32(b[r], d[kSplit ? r : 0]) : b[r];
  }
}

// One tile (8 outputs from n0) for R rows from m0, as tile_rows in qdot_linear.cpp.
template <bool Four, class S, int R, bool Fine>
void tile_rows(const Operands& a, int64_t m0, const uint8_t* codes, const S* scale, const S* offset, int64_t n0) {
  constexpr int64_t kBytes = Four ? kQ4GroupBytes : kQ8GroupBytes;
  const int64_t K = a.K, G = a.G;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const void *x[R], *xr[R];
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * K + g * kGroup;
      x[r] = Four ? static_cast<const void*>(a.q + at) : a.qu + at;
      xr[r] = !Fine ? nullptr : Four ? static_cast<const void*>(a.r + at) : a.ru + at;
    }
    __m256i p[R], pr[R];
    dot<Four, R, Fine>(codes + g * kBytes, x, xr, p, pr);
    const __m256 s = load8(scale + g * kTile), o = load8(offset + g * kTile);
    for (int r = 0; r < R; ++r) {  // qdot_rows.h's epilogue
      const int64_t i = (m0 + r) * G + g;
      // |p| <= 32 * 128 * 127: 128 p fits int32 (Fine: the two bytes are q * 128 + r)
      const __m256i pi = Fine ? _mm256_add_epi32(_mm256_slli_epi32(p[r], 7), pr[r]) : p[r];
      const __m256 pu = _mm256_cvtepi32_ps(pi), u = _mm256_broadcast_ss(a.u + i);
      const __m256 t = Four ? _mm256_fmadd_ps(pu, u, _mm256_broadcast_ss(a.c + i)) : _mm256_mul_ps(pu, u);
      acc[r] = _mm256_fmadd_ps(o, _mm256_broadcast_ss(a.s + i), _mm256_fmadd_ps(s, t, acc[r]));
    }
  }
  if (a.ko > 0)  // the outlier channels (qdot_rows.h)
    add_outliers<R>(acc, a.xo + m0 * a.ko, a.ko, a.wo + (n0 / kTile) * a.ko * kTile);
  for (int r = 0; r < R; ++r) {
    float* yr = a.y + (m0 + r) * a.N + n0;
    const __m256 v = acc[r];
    if (n0 + kTile <= a.N) {
      _mm256_storeu_ps(yr, v);
    } else {
      alignas(32) float tmp[kTile];
      _mm256_store_ps(tmp, v);
      for (int64_t c = 0; c < a.N - n0; ++c) yr[c] = tmp[c];
    }
  }
}

// dot's one-byte sums (Fine off) for two tiles at once, c0's outputs in the low half: each
// broadcast of a row's 4 bytes feeds 16 outputs. Integer sums, so the same as dot's.
template <bool Four, int R>
inline void dot2(const uint8_t* w0, const uint8_t* w1, const void* const (&x_)[R], __m512i (&p)[R]) {
  using B = std::conditional_t<Four, int8_t, uint8_t>;
  const B* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const B*>(x_[r]);
  constexpr bool kSplit = R <= 2;
  __m512i a[R], c[kSplit ? R : 1];
  for (int r = 0; r < R; ++r) {
    a[r] = _mm512_setzero_si512();
    if constexpr (kSplit) c[r] = _mm512_setzero_si512();
  }
  auto bcast = [](const B* q) { return _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(q)); };
  if constexpr (Four) {
    const __m512i m = _mm512_set1_epi8(0x0F);
    for (int i = 0; i < 4; ++i) {
      const __m512i v = load32x2(w0 + 32 * i, w1 + 32 * i);
      const __m512i lo = _mm512_and_si512(v, m), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
      for (int r = 0; r < R; ++r) {
        a[r] = _mm512_dpbusd_epi32(a[r], lo, bcast(x[r] + 8 * i));
        __m512i& ah = kSplit ? c[kSplit ? r : 0] : a[r];
        ah = _mm512_dpbusd_epi32(ah, hi, bcast(x[r] + 8 * i + 4));
      }
    }
  } else {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sum = _mm512_setzero_si512();
    for (int s = 0; s < 8; ++s) {
      const __m512i v = load32x2(w0 + 32 * s, w1 + 32 * s);
      sum = _mm512_dpbusd_epi32(sum, ones, v);
      for (int r = 0; r < R; ++r) {
        __m512i& as = (kSplit && (s & 1)) ? c[kSplit ? r : 0] : a[r];
        as = _mm512_dpbusd_epi32(as, bcast(x[r] + 4 * s), v);
      }
    }
    sum = _mm512_slli_epi32(sum, 7);
    for (int r = 0; r < R; ++r) a[r] = _mm512_sub_epi32(a[r], sum);
  }
  for (int r = 0; r < R; ++r) p[r] = kSplit ? _mm512_add_epi32(a[r], c[kSplit ? r : 0]) : a[r];
}

// tile_rows (Fine off) for tiles t and t + 1, both whole (16 outputs from n0), in 512-bit
// vectors: each float step of the epilogue serves both tiles. Lane for lane the operations
// of tile_rows, in its order: the same bits.
template <bool Four, class S, int R>
void pair_rows(const Operands& a, int64_t m0, int64_t t) {
  constexpr int64_t kBytes = Four ? kQ4GroupBytes : kQ8GroupBytes;
  const int64_t K = a.K, G = a.G;
  const uint8_t *c0 = a.codes + t * G * kBytes, *c1 = c0 + G * kBytes;
  const S *s0 = static_cast<const S*>(a.scale) + t * G * kTile, *s1 = s0 + G * kTile;
  const S *o0 = static_cast<const S*>(a.offset) + t * G * kTile, *o1 = o0 + G * kTile;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const void* x[R];
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * K + g * kGroup;
      x[r] = Four ? static_cast<const void*>(a.q + at) : a.qu + at;
    }
    __m512i p[R];
    dot2<Four, R>(c0 + g * kBytes, c1 + g * kBytes, x, p);
    const __m512 s = load16(s0 + g * kTile, s1 + g * kTile), o = load16(o0 + g * kTile, o1 + g * kTile);
    for (int r = 0; r < R; ++r) {  // qdot_rows.h's epilogue
      const int64_t i = (m0 + r) * G + g;
      const __m512 pu = _mm512_cvtepi32_ps(p[r]), u = _mm512_set1_ps(a.u[i]);
      const __m512 t = Four ? _mm512_fmadd_ps(pu, u, _mm512_set1_ps(a.c[i])) : _mm512_mul_ps(pu, u);
      acc[r] = _mm512_fmadd_ps(o, _mm512_set1_ps(a.s[i]), _mm512_fmadd_ps(s, t, acc[r]));
    }
  }
  if (a.ko > 0) {
    const float* xo = a.xo + m0 * a.ko;
    __m512 odd[R];
    for (int r = 0; r < R; ++r) odd[r] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 1 < a.ko; j += 2) {
      const __m512 w0 = load16(a.wo + (t * a.ko + j) * kTile, a.wo + ((t + 1) * a.ko + j) * kTile);
      const __m512 w1 = load16(a.wo + (t * a.ko + j + 1) * kTile, a.wo + ((t + 1) * a.ko + j + 1) * kTile);
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xo[r * a.ko + j]), w0, acc[r]);
        odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(xo[r * a.ko + j + 1]), w1, odd[r]);
      }
    }
    if (j < a.ko) {
      const __m512 w0 = load16(a.wo + (t * a.ko + j) * kTile, a.wo + ((t + 1) * a.ko + j) * kTile);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xo[r * a.ko + j]), w0, acc[r]);
    }
    for (int r = 0; r < R; ++r) acc[r] = _mm512_add_ps(acc[r], odd[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(a.y + (m0 + r) * a.N + t * kTile, acc[r]);
}

template <bool Four, class S, int R>
inline void pair_rows_of(const Operands& a, int64_t m, int64_t n, int64_t t) {
  if constexpr (R > 1) {
    if (n < R) return pair_rows_of<Four, S, R - 1>(a, m, n, t);
  }
  pair_rows<Four, S, R>(a, m, t);
}

template <bool Four, class S, bool Fine, int R>
inline void rows_of(const Operands& a, int64_t m, int64_t n, const uint8_t* c, const S* s, const S* o, int64_t n0) {
  if constexpr (R > 1) {
    if (n < R) return rows_of<Four, S, Fine, R - 1>(a, m, n, c, s, o, n0);
  }
  tile_rows<Four, S, R, Fine>(a, m, c, s, o, n0);
}

// From this many rows two tiles go in 512-bit vectors (pair_rows): all SmolLM2's layer
// products took 0.75-0.82x the time at 64 rows, 0.76-0.77x at 256, 0.87x at 32 on a Zen 4
// EPYC; at 1-8 rows 512-bit vectors were 1.03-1.27x slower (a few rows' sums are bound by
// the multiply-adds' latency, longer on 512-bit vectors), so those keep one tile in 256.
constexpr int64_t kPairRows = 9;

template <bool Four, class S, bool Fine>
void tiles(const Operands& a, int64_t t0, int64_t t1) {
  constexpr int64_t kBytes = Four ? kQ4GroupBytes : kQ8GroupBytes;
  constexpr int kRows = 8;  // 16 integer accumulators (fine) stay in the 32 registers
  const S *sp = static_cast<const S*>(a.scale), *op = static_cast<const S*>(a.offset);
  for (int64_t t = t0; t < t1; ++t) {
    if (!Fine && a.M >= kPairRows && t + 1 < t1 && (t + 2) * kTile <= a.N) {  // two whole tiles
      for (int64_t m = 0; m < a.M; m += kRows) pair_rows_of<Four, S, kRows>(a, m, std::min<int64_t>(kRows, a.M - m), t);
      ++t;
      continue;
    }
    const uint8_t* c = a.codes + t * a.G * kBytes;
    const S *s = sp + t * a.G * kTile, *o = op + t * a.G * kTile;
    for (int64_t m = 0; m < a.M; m += kRows)
      rows_of<Four, S, Fine, kRows>(a, m, std::min<int64_t>(kRows, a.M - m), c, s, o, t * kTile);
  }
}

template <bool Four>
void by_scales(const Operands& a, int64_t t0, int64_t t1) {
  if (a.half)
    a.fine ? tiles<Four, uint16_t, true>(a, t0, t1) : tiles<Four, uint16_t, false>(a, t0, t1);
  else
    a.fine ? tiles<Four, float, true>(a, t0, t1) : tiles<Four, float, false>(a, t0, t1);
}

}  // namespace

void vnni_tiles(const Operands& a, int64_t t0, int64_t t1) {
  a.four_bit ? by_scales<true>(a, t0, t1) : by_scales<false>(a, t0, t1);
}

#pragma GCC pop_options

}  // namespace llmserve::qdot
