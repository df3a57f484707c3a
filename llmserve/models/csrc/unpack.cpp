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

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kTile = 8;
constexpr int64_t kSteps = kGroup / 4;

template <class S>
void unpack_tile(const uint8_t* codes, const S* scale, const S* offset, bool four_bit, float* w, int64_t K,
                 int64_t N, int64_t t) {
  const int64_t G = K / kGroup, n0 = t * kTile;
  for (int64_t g = 0; g < G; ++g) {
    if (four_bit) {
      // Output o's 8 codes of a 32-byte chunk i sit in its 4 bytes there: low nibbles
      // k = 8i..8i+3, high nibbles k = 8i+4..8i+7. One variable shift spreads them over a
      // vector, so each output row gets whole 8-float stores, in order.
      const uint8_t* p = codes + g * kGroup * kTile / 2;
      const __m256i shifts = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28);
      for (int64_t o = 0; o < kTile && n0 + o < N; ++o) {
        const __m256 so = _mm256_set1_ps(static_cast<float>(scale[g * kTile + o]));
        const __m256 oo = _mm256_set1_ps(static_cast<float>(offset[g * kTile + o]));
        float* dst = w + (n0 + o) * K + g * kGroup;
        for (int64_t i = 0; i < kSteps / 2; ++i) {
          const __m256i v = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(p + 32 * i + 4 * o));
          const __m256i j = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), _mm256_set1_epi32(0x0F));
          _mm256_storeu_ps(dst + 8 * i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(j), so), oo));
        }
      }
    } else {
      // 8-bit: output o's codes k = 8i..8i+3 are its 4 bytes of step 2i, k = 8i+4..8i+7 of step 2i + 1
      const uint8_t* p = codes + g * kGroup * kTile;
      for (int64_t o = 0; o < kTile && n0 + o < N; ++o) {
        const __m256 so = _mm256_set1_ps(static_cast<float>(scale[g * kTile + o]));
        const __m256 oo = _mm256_set1_ps(static_cast<float>(offset[g * kTile + o]));
        float* dst = w + (n0 + o) * K + g * kGroup;
        for (int64_t i = 0; i < kSteps / 2; ++i) {
          const int32_t a = *reinterpret_cast<const int32_t*>(p + 64 * i + 4 * o);
          const int32_t b = *reinterpret_cast<const int32_t*>(p + 64 * i + 32 + 4 * o);
          const __m256i j = _mm256_cvtepi8_epi32(_mm_setr_epi32(a, b, 0, 0));
          _mm256_storeu_ps(dst + 8 * i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(j), so), oo));
        }
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
