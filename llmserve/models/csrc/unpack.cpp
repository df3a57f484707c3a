// The fp32 weights an int8 layer's packed codes hold, unpacked into a buffer the caller
// reuses: prefill rows then go through torch's fp32 GEMM without the layer keeping a
// 4-byte copy of every weight (~0.5 GB for SmolLM2). Unpacking a layer is one pass over
// its codes (~0.6 bytes a weight in, 4 out, into cache), paid once per step and shared by
// every prefill row of it.
//
// W[n, k] = code * scale + offset, multiplied then added (no FMA: the flags turn contraction
// off), as qlayout.PackedWeights.dequantized computes it, so both give the same bits. The
// layout (qlayout.py): tiles of 8 outputs; a tile's group is 8 steps of 32 bytes, each
// holding 4 consecutive codes of each of the 8 outputs (4-bit codes: step 2i in the low
// nibbles, 2i + 1 in the high nibbles of 32 bytes).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "simd.h"

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kTile = 8;
constexpr int64_t kSteps = kGroup / 4;

using llmserve::load8;

// 32 bytes of one step (4 codes of each of 8 outputs, as int32 after widening) to the 8
// outputs' rows at column k: lanes 0-3 of a widened half are output 2j, lanes 4-7 output 2j + 1.
inline void put_step(const __m256i (&c)[4], const __m256 (&s)[4], const __m256 (&o)[4], float* w, int64_t K,
                     int64_t n0, int64_t N, int64_t k) {
  for (int j = 0; j < 4; ++j) {
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c[j]), s[j]), o[j]);
    const int64_t a = n0 + 2 * j, b = a + 1;
    if (a < N) _mm_storeu_ps(w + a * K + k, _mm256_castps256_ps128(v));
    if (b < N) _mm_storeu_ps(w + b * K + k, _mm256_extractf128_ps(v, 1));
  }
}

// the 32 bytes of a step widened to int32, 8 at a time: [outputs 2j, 2j + 1] x 4 codes
inline void widen(__m256i bytes, bool is_signed, __m256i (&c)[4]) {
  const __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int j = 0; j < 4; ++j) c[j] = is_signed ? _mm256_cvtepi8_epi32(parts[j]) : _mm256_cvtepu8_epi32(parts[j]);
}

template <class S>
void unpack_tile(const uint8_t* codes, const S* scale, const S* offset, bool four_bit, float* w, int64_t K,
                 int64_t N, int64_t t) {
  const int64_t G = K / kGroup, n0 = t * kTile;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    // per pair of outputs (2j, 2j + 1): their scale and offset, 4 lanes each
    const __m256 sg = load8(scale + g * kTile), og = load8(offset + g * kTile);
    __m256 s[4], o[4];
    for (int j = 0; j < 4; ++j) {
      const __m256i idx = _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1);
      s[j] = _mm256_permutevar8x32_ps(sg, idx);
      o[j] = _mm256_permutevar8x32_ps(og, idx);
    }
    __m256i c[4];
    if (four_bit) {
      const uint8_t* p = codes + g * kGroup * kTile / 2;
      for (int64_t i = 0; i < kSteps / 2; ++i) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i));
        widen(_mm256_and_si256(v, nib), false, c);
        put_step(c, s, o, w, K, n0, N, g * kGroup + 8 * i);
        widen(_mm256_and_si256(_mm256_srli_epi16(v, 4), nib), false, c);
        put_step(c, s, o, w, K, n0, N, g * kGroup + 8 * i + 4);
      }
    } else {
      const uint8_t* p = codes + g * kGroup * kTile;
      for (int64_t i = 0; i < kSteps; ++i) {
        widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i)), true, c);
        put_step(c, s, o, w, K, n0, N, g * kGroup + 4 * i);
      }
    }
  }
}

}  // namespace

// codes: qlayout's 4-bit (uint8) or 8-bit (int8) codes; scale, offset [ceil(N / 8), K / 32, 8]
// float16 or float32; out: a contiguous float32 buffer of at least N * K values, whose first
// N * K become W [N, K]. Returns that [N, K] view of out.
at::Tensor unpack_weights(at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t N, at::Tensor out) {
  TORCH_CHECK(codes.is_contiguous() && scale.is_contiguous() && offset.is_contiguous() &&
                  scale.scalar_type() == offset.scalar_type() && scale.sizes() == offset.sizes() && scale.dim() == 3,
              "scale and offset must be contiguous [ceil(N / 8), K / 32, 8] of one dtype");
  const int64_t tiles = scale.size(0), G = scale.size(1), K = G * kGroup;
  const bool four_bit = codes.scalar_type() == at::kByte;
  TORCH_CHECK(four_bit || codes.scalar_type() == at::kChar, "codes must be uint8 (4-bit) or int8");
  TORCH_CHECK(tiles == (N + kTile - 1) / kTile && scale.size(2) == kTile &&
                  codes.numel() == tiles * G * kGroup * kTile / (four_bit ? 2 : 1),
              "codes, scale and offset do not hold N outputs");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() >= N * K,
              "out must be a contiguous float32 buffer of at least N * K values");
  const uint8_t* cp = reinterpret_cast<const uint8_t*>(codes.data_ptr());
  float* wp = out.data_ptr<float>();
  const int64_t tile_bytes = G * kGroup * kTile / (four_bit ? 2 : 1);
  const bool half = scale.scalar_type() == at::kHalf;
  TORCH_CHECK(half || scale.scalar_type() == at::kFloat, "scale and offset must be float32 or float16");
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (half)
        unpack_tile(cp + t * tile_bytes, scale.data_ptr<at::Half>() + t * G * kTile,
                    offset.data_ptr<at::Half>() + t * G * kTile, four_bit, wp, K, N, t);
      else
        unpack_tile(cp + t * tile_bytes, scale.data_ptr<float>() + t * G * kTile,
                    offset.data_ptr<float>() + t * G * kTile, four_bit, wp, K, N, t);
    }
  });
  return out.flatten().narrow(0, 0, N * K).view({N, K});
}
