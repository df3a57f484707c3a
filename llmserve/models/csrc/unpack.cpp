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

#include <algorithm>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kTile = 8;
constexpr int64_t kSteps = kGroup / 4;

// Output o of a tile (its codes from ``codes``, its group factors from scale / offset
// [G][8]) into dst[0, K).
template <class S>
void unpack_output(const uint8_t* codes, const S* scale, const S* offset, bool four_bit, int64_t G, int64_t o,
                   float* dst) {
  for (int64_t g = 0; g < G; ++g, dst += kGroup) {
    const __m256 so = _mm256_set1_ps(static_cast<float>(scale[g * kTile + o]));
    const __m256 oo = _mm256_set1_ps(static_cast<float>(offset[g * kTile + o]));
    if (four_bit) {
      // Output o's 8 codes of a 32-byte chunk i sit in its 4 bytes there: low nibbles
      // k = 8i..8i+3, high nibbles k = 8i+4..8i+7. One variable shift spreads them over a
      // vector, so each output row gets whole 8-float stores, in order.
      const uint8_t* p = codes + g * kGroup * kTile / 2;
      const __m256i shifts = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28);
      for (int64_t i = 0; i < kSteps / 2; ++i) {
        const __m256i v = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(p + 32 * i + 4 * o));
        const __m256i j = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), _mm256_set1_epi32(0x0F));
        _mm256_storeu_ps(dst + 8 * i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(j), so), oo));
      }
    } else {
      // 8-bit: output o's codes k = 8i..8i+3 are its 4 bytes of step 2i, k = 8i+4..8i+7 of step 2i + 1
      const uint8_t* p = codes + g * kGroup * kTile;
      for (int64_t i = 0; i < kSteps / 2; ++i) {
        const int32_t a = *reinterpret_cast<const int32_t*>(p + 64 * i + 4 * o);
        const int32_t b = *reinterpret_cast<const int32_t*>(p + 64 * i + 32 + 4 * o);
        const __m256i j = _mm256_cvtepi8_epi32(_mm_setr_epi32(a, b, 0, 0));
        _mm256_storeu_ps(dst + 8 * i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(j), so), oo));
      }
    }
  }
}

struct Packed {
  const uint8_t* codes;
  const void *scale, *offset;
  bool half, four_bit;
  int64_t tiles, G, K, tile_bytes;

  Packed(const at::Tensor& codes_, const at::Tensor& scale_, const at::Tensor& offset_, int64_t N) {
    TORCH_CHECK(codes_.is_contiguous() && scale_.is_contiguous() && offset_.is_contiguous() &&
                    scale_.scalar_type() == offset_.scalar_type() && scale_.sizes() == offset_.sizes() &&
                    scale_.dim() == 3,
                "scale and offset must be contiguous [ceil(N / 8), K / 32, 8] of one dtype");
    tiles = scale_.size(0), G = scale_.size(1), K = G * kGroup;
    four_bit = codes_.scalar_type() == at::kByte;
    TORCH_CHECK(four_bit || codes_.scalar_type() == at::kChar, "codes must be uint8 (4-bit) or int8");
    TORCH_CHECK(tiles == (N + kTile - 1) / kTile && scale_.size(2) == kTile &&
                    codes_.numel() == tiles * G * kGroup * kTile / (four_bit ? 2 : 1),
                "codes, scale and offset do not hold N outputs");
    half = scale_.scalar_type() == at::kHalf;
    TORCH_CHECK(half || scale_.scalar_type() == at::kFloat, "scale and offset must be float32 or float16");
    codes = reinterpret_cast<const uint8_t*>(codes_.data_ptr());
    scale = scale_.data_ptr(), offset = offset_.data_ptr();
    tile_bytes = G * kGroup * kTile / (four_bit ? 2 : 1);
  }

  // output n of W into dst[0, K)
  void output(int64_t n, float* dst) const {
    const int64_t t = n / kTile, at = t * G * kTile;
    if (half)
      unpack_output(codes + t * tile_bytes, static_cast<const at::Half*>(scale) + at,
                    static_cast<const at::Half*>(offset) + at, four_bit, G, n % kTile, dst);
    else
      unpack_output(codes + t * tile_bytes, static_cast<const float*>(scale) + at,
                    static_cast<const float*>(offset) + at, four_bit, G, n % kTile, dst);
  }
};

}  // namespace

// codes: qlayout's 4-bit (uint8) or 8-bit (int8) codes; scale, offset [ceil(N / 8), K / 32, 8]
// float16 or float32; out: a contiguous float32 buffer of at least N * K values, whose first
// N * K become W [N, K]. Returns that [N, K] view of out.
at::Tensor unpack_weights(at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t N, at::Tensor out) {
  const Packed p(codes, scale, offset, N);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() >= N * p.K,
              "out must be a contiguous float32 buffer of at least N * K values");
  float* wp = out.data_ptr<float>();
  at::parallel_for(0, p.tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t n = t0 * kTile; n < std::min(N, t1 * kTile); ++n) p.output(n, wp + n * p.K);
  });
  return out.flatten().narrow(0, 0, N * p.K).view({N, p.K});
}

// W[index] [len(index), K] (index: int64 outputs in [0, N)): a tied embedding's lookup, the
// rows a rescored head recomputes; the bits of unpack_weights' rows.
at::Tensor unpack_rows(at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t N, at::Tensor index) {
  const Packed p(codes, scale, offset, N);
  TORCH_CHECK(index.scalar_type() == at::kLong && index.dim() == 1, "index must be a 1-D int64 tensor");
  index = index.contiguous();
  const int64_t R = index.numel();
  const int64_t* ip = index.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) TORCH_CHECK(ip[r] >= 0 && ip[r] < N, "index out of range [0, N)");
  auto w = at::empty({R, p.K}, codes.options().dtype(at::kFloat));
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) p.output(ip[r], wp + r * p.K);
  });
  return w;
}
