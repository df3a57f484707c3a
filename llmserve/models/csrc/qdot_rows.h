// What the int8 products' two instruction sets share (qdot_linear.cpp: AVX2; qdot_vnni.cpp:
// AVX-512 VNNI, several rows per weight read): the layout's constants, one call's operands and
// the outlier channels' loop of a 256-bit tile.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace llmserve::qdot {

constexpr int64_t kGroup = 32;
constexpr int64_t kTile = 8;  // outputs per tile: one float vector
constexpr int64_t kQ4GroupBytes = kTile * kGroup / 2, kQ8GroupBytes = kTile * kGroup;
constexpr float kQ4Center = 7.5f;  // 4-bit codes j count as j - 7.5 (see Q4 in qdot_linear.cpp)

// One product y [M, N] = x [M, K] W^T: x as quantised (per group [M, G]: u, s, c), the
// weights as qlayout packs them, scale / offset float16 (half) or float32.
//
// Both kernels take each group's integer sums p into one float sum a row and 8 outputs, in
// this order (the same bits):  acc = fma(o, xs, fma(s, t, acc)),  t = p * u + c (4-bit codes)
// or p * u (8-bit); then the outlier channels' products, even ones into acc and odd ones into
// a second sum, added last. One sum and two chains, not three: the sums of 4 rows (AVX2) fit
// the registers, and the chains' latency does not bound the outlier channels' loop.
struct Operands {
  int64_t M, K, G, N;
  const int8_t *q, *r;  // [M, K]; r only when fine
  const uint8_t *qu, *ru;  // 8-bit codes: q + 128 and r + 128, vpdpbusd's unsigned side
  const float *u, *s, *c;
  const uint8_t* codes;
  const void *scale, *offset;
  bool half, fine, four_bit;
  float* y;
  // Outlier channels (qdot_linear.cpp's Acts): x's values there [M, ko] and their weights
  // [tiles, ko, 8] as IEEE halves (widened to fp32), whose products both kernels add, channel
  // by channel, after the groups' sums; ko = 0: none.
  const float* xo;
  const uint16_t* wo;
  int64_t ko;
};

namespace {  // internal linkage: each kernel file builds its own copy, for AVX2 (before any target pragma)

// The outlier channels' products for R rows of one tile (8 outputs), in the order both kernels
// keep: channel j's float16 weights w [ko][8] times row r's value xo[r * ko + j], even channels
// into acc and odd ones into a second sum, added last.
template <int R>
inline void add_outliers(__m256 (&acc)[R], const float* xo, int64_t ko, const uint16_t* w) {
  const auto weights = [w](int64_t j) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j * kTile)));
  };
  __m256 odd[R];
  for (int r = 0; r < R; ++r) odd[r] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 1 < ko; j += 2) {
    const __m256 w0 = weights(j), w1 = weights(j + 1);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(xo + r * ko + j), w0, acc[r]);
      odd[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(xo + r * ko + j + 1), w1, odd[r]);
    }
  }
  if (j < ko) {
    const __m256 w0 = weights(j);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(xo + r * ko + j), w0, acc[r]);
  }
  for (int r = 0; r < R; ++r) acc[r] = _mm256_add_ps(acc[r], odd[r]);
}

}  // namespace

// Whether this CPU has AVX-512 VNNI (with VL and BW): vnni_tiles may run.
bool vnni_supported();

// Tiles [t0, t1) of the product for every row, up to 8 rows (fine: 4) per read of a tile's
// codes; the same bits as the AVX2 kernel (integer sums are exact; the float steps are theirs).
void vnni_tiles(const Operands& a, int64_t t0, int64_t t1);

}  // namespace llmserve::qdot
