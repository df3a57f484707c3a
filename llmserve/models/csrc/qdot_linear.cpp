// Integer dot products for the int8 layers' small-M path (decode steps: a few rows x every
// weight), llama.cpp style, on x86 CPUs with AVX2 + FMA + F16C (no VNNI needed).
//
// W[n, k] = code[n, k] * scale[n, g] + offset[n, g] for the group g = k / 32. Each row of x
// is quantised per 32 too: x ~ xd * q (q = round(x / xd) in -127..127, xd = absmax / 127),
// keeping its exact fp32 group sums xs, so that
//   sum_k W[n, k] x[k] = sum_g scale * xd * sum_k(code * q) + offset * xs.
// The inner sums are integer: _mm256_maddubs_epi16 multiplies unsigned by signed bytes and
// adds neighbours into int16, _mm256_madd_epi16 widens to int32; a float epilogue per group,
// row and 8 outputs remains (qdot_rows.h). Fine: the rounding's residual takes a second byte,
// x ~ xd * (q + r / 128), and a second maddubs, so the activations carry 15 bits, for twice
// the arithmetic. One byte loses greedy agreement with fp32 on SmolLM2's outlier channels
// unless those are set aside (Acts, qdot_acts.h): the Python layer's default since issue 28.
// Seven bits (|q| <= 63; the rescored 8-bit head, quant.py): the codes then go in unsigned as
// w + 128 against q signed, and no int16 pair can saturate (2 * 255 * 63 < 2^15), so the dot
// drops the sign fix-ups of 8-bit codes against 8-bit activations: 3 operations per 32
// multiply-adds, not 4; 128 * sum(q) comes off the integer sum, exactly.
//
// The layout (llmserve/models/qlayout.py) serves both costs of a decode step: bytes (4-bit
// codes for 16-level sources such as GGUF Q4_1, 8-bit for Q8_0; float16 scales where exact)
// and instructions (tiles of 8 outputs whose codes come 4 per output and step, so products
// sum in place and scales apply to 8 outputs at once). Weights stream once, in order, per
// call; rows go 4 (fine: 2) at a time over a tile held in L1. Where the CPU has AVX-512
// VNNI, qdot_vnni.cpp takes the call after the activations are quantised: same bits, up to
// 8 rows per read of a tile's codes (verification steps of speculative decoding).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "qdot_acts.h"
#include "qdot_rows.h"
#include "simd.h"

namespace {

using llmserve::qdot::kGroup;
using llmserve::qdot::kTile;
constexpr int64_t kRowsPerPass = 4;
// AVX-512 VNNI where the CPU has it (qdot_vnni.cpp: same bits, several rows per weight read)
bool use_vnni = llmserve::qdot::vnni_supported();

using llmserve::load8;


inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i bcast4(const int8_t* p) { return _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(p)); }

// A group's products for a tile: p[r] = per output, the sum over its 32 codes of code * X
// for row r, as int32, X = q (fine: 128 q + r). The codes of a tile's group are 8 steps of
// 32 bytes: 4 consecutive codes of each of the 8 outputs, so maddubs + madd sum 4 products
// per output in place and x enters as its 4 codes of the step, broadcast (the VNNI layout):
// no horizontal sums anywhere.
struct Q4 {
  static constexpr int64_t kGroupBytes = llmserve::qdot::kQ4GroupBytes;  // step 2i: low nibbles; 2i + 1: high
  // Codes 0..15 against the rounded x would weigh the rounding of x's whole group sum by
  // the group's mean weight (one-byte activations: perplexity +1.6 % on SmolLM2, against
  // +0.06 % with the int8 form's centred codes). So the codes are centred, j - 7.5, with
  // the offset moved to offset + 7.5 * scale against the exact xs; in sums over j the
  // difference is one term (u: the unit of X, see Acts in qdot_acts.h):
  //   scale * u * sum((j - 7.5) * X) + (offset + 7.5 * scale) * xs
  //     = scale * u * sum(j * X) + offset * xs + 7.5 * scale * e.
  static constexpr float kCenter = llmserve::qdot::kQ4Center;
  static constexpr bool kShifted = false;  // whether the dot took the codes as w + 128 (Q8Seven)
  template <int R, bool Fine>
  static inline void dot(const uint8_t* w, const int8_t* const (&x)[R], const int8_t* const (&xr)[R],
                         __m256i (&p)[R]) {
    // codes <= 15, |q| <= 127 (|r| <= 64): a maddubs lane is at most 2 * 15 * 127 = 3810, so
    // the 8 steps of a group add up in int16 (<= 30480) before one madd widens them
    const __m256i m = _mm256_set1_epi8(0x0F);
    __m256i a[R], b[Fine ? R : 1];
    for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_si256();
    if constexpr (Fine)
      for (int r = 0; r < R; ++r) b[r] = _mm256_setzero_si256();
    // Not unrolled: unrolled, the compiler reassociates the int16 sums into trees whose
    // partial results spill to the stack with two rows and two bytes (Fine).
#pragma GCC unroll 1
    for (int i = 0; i < 4; ++i) {
      const __m256i v = load32(w + 32 * i);
      const __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
      for (int r = 0; r < R; ++r) {
        a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(lo, bcast4(x[r] + 8 * i)));
        a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(hi, bcast4(x[r] + 8 * i + 4)));
        if constexpr (Fine) {
          b[r] = _mm256_add_epi16(b[r], _mm256_maddubs_epi16(lo, bcast4(xr[r] + 8 * i)));
          b[r] = _mm256_add_epi16(b[r], _mm256_maddubs_epi16(hi, bcast4(xr[r] + 8 * i + 4)));
        }
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; ++r) {
      p[r] = _mm256_madd_epi16(a[r], ones);
      if constexpr (Fine) p[r] = _mm256_add_epi32(_mm256_slli_epi32(p[r], 7), _mm256_madd_epi16(b[r], ones));
    }
  }
};

struct Q8 {
  static constexpr int64_t kGroupBytes = llmserve::qdot::kQ8GroupBytes;
  static constexpr float kCenter = 0.f;  // codes -128..127 are centred already
  static constexpr bool kShifted = false;
  template <int R, bool Fine>
  static inline void dot(const uint8_t* w, const int8_t* const (&x)[R], const int8_t* const (&xr)[R],
                         __m256i (&p)[R]) {
    // maddubs wants one unsigned side: |code| times q with code's sign (-128 reads as 128);
    // a lane reaches 2 * 128 * 127 = 32512, so each step widens to int32 at once
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i b[Fine ? R : 1];
    for (int r = 0; r < R; ++r) p[r] = _mm256_setzero_si256();
    if constexpr (Fine)
      for (int r = 0; r < R; ++r) b[r] = _mm256_setzero_si256();
#pragma GCC unroll 1  // (as Q4's: unrolled, the sums become trees whose partial results spill)
    for (int s = 0; s < 8; ++s) {
      const __m256i v = load32(w + 32 * s), u = _mm256_sign_epi8(v, v);
      for (int r = 0; r < R; ++r) {
        const __m256i xs = _mm256_sign_epi8(bcast4(x[r] + 4 * s), v);
        p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xs), ones));
        if constexpr (Fine) {
          const __m256i rs = _mm256_sign_epi8(bcast4(xr[r] + 4 * s), v);
          b[r] = _mm256_add_epi32(b[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, rs), ones));
        }
      }
    }
    if constexpr (Fine)  // |p| <= 32 * 128 * 127: 128 p fits int32
      for (int r = 0; r < R; ++r) p[r] = _mm256_add_epi32(_mm256_slli_epi32(p[r], 7), b[r]);
  }
};

// 8-bit codes against seven-bit activations: maddubs takes the codes as w + 128 (unsigned,
// flipping the sign bit), q as they are; a lane reaches 2 * 255 * 63 = 32130. The sum is then
// p + 128 * sum(q), which tile_rows takes off (kShifted).
struct Q8Seven {
  static constexpr int64_t kGroupBytes = llmserve::qdot::kQ8GroupBytes;
  static constexpr float kCenter = 0.f;
  static constexpr bool kShifted = true;
  template <int R, bool Fine>
  static inline void dot(const uint8_t* w, const int8_t* const (&x)[R], const int8_t* const (&)[R],
                         __m256i (&p)[R]) {
    static_assert(!Fine, "seven-bit activations are one byte");
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int r = 0; r < R; ++r) p[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int s = 0; s < 8; ++s) {
      const __m256i v = _mm256_xor_si256(load32(w + 32 * s), flip);
      for (int r = 0; r < R; ++r)
        p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(_mm256_maddubs_epi16(v, bcast4(x[r] + 4 * s)), ones));
    }
  }
};

// One tile (8 outputs from n0) for R rows from m0: codes [G][kGroupBytes]; scale and offset [G][8].
template <class Codes, class S, int R, bool Fine>
void tile_rows(const Acts& a, int64_t m0, const uint8_t* codes, const S* scale, const S* offset, float* y,
               int64_t N, int64_t n0, const c10::Half* wo) {
  const int64_t K = a.K, G = a.G;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int8_t *x[R], *xr[R];
    for (int r = 0; r < R; ++r) {
      x[r] = a.q.data() + (m0 + r) * K + g * kGroup;
      xr[r] = Fine ? a.r.data() + (m0 + r) * K + g * kGroup : nullptr;
    }
    __m256i p[R];
    Codes::template dot<R, Fine>(codes + g * Codes::kGroupBytes, x, xr, p);
    const __m256 s = load8(scale + g * kTile), o = load8(offset + g * kTile);
    for (int r = 0; r < R; ++r) {  // qdot_rows.h's epilogue
      const int64_t i = (m0 + r) * G + g;
      if constexpr (Codes::kShifted) p[r] = _mm256_sub_epi32(p[r], _mm256_set1_epi32(128 * a.n[i]));
      const __m256 pu = _mm256_cvtepi32_ps(p[r]), u = _mm256_broadcast_ss(&a.u[i]);
      const __m256 t = Codes::kCenter != 0.f ? _mm256_fmadd_ps(pu, u, _mm256_broadcast_ss(&a.c[i])) : _mm256_mul_ps(pu, u);
      acc[r] = _mm256_fmadd_ps(o, _mm256_broadcast_ss(&a.s[i]), _mm256_fmadd_ps(s, t, acc[r]));
    }
  }
  if (a.ko > 0)  // the outlier channels (qdot_rows.h)
    llmserve::qdot::add_outliers<R>(acc, a.xo.data() + m0 * a.ko, a.ko,
                                    reinterpret_cast<const uint16_t*>(wo) + (n0 / kTile) * a.ko * kTile);
  for (int r = 0; r < R; ++r) {
    float* yr = y + (m0 + r) * N + n0;
    const __m256 v = acc[r];
    if (n0 + kTile <= N) {
      _mm256_storeu_ps(yr, v);
    } else {
      alignas(32) float tmp[kTile];
      _mm256_store_ps(tmp, v);
      for (int64_t c = 0; c < N - n0; ++c) yr[c] = tmp[c];
    }
  }
}

template <class Codes, class S, bool Fine>
at::Tensor run(const at::Tensor& x_, const at::Tensor& codes, const at::Tensor& scale,
                  const at::Tensor& offset, int64_t N, const at::Tensor& chans, const at::Tensor& wo_) {
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup, tiles = (N + kTile - 1) / kTile;
  const int64_t ko = chans.defined() ? chans.numel() : 0;
  const Acts a(x.data_ptr<float>(), M, K, Fine, ko ? chans.data_ptr<int64_t>() : nullptr, ko,
               Codes::kShifted ? 7 : 8);
  const c10::Half* wo = ko ? wo_.data_ptr<at::Half>() : nullptr;
  auto y = at::empty({M, N}, x.options());
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const S *sp = scale.data_ptr<S>(), *op = offset.data_ptr<S>();
  float* yp = y.data_ptr<float>();
  if (use_vnni) {
    constexpr bool four = std::is_same_v<Codes, Q4>;
    std::vector<uint8_t> qu, ru;  // 8-bit codes: x's bytes + 128 (flipping the sign bit)
    for (auto [from, to] : {std::pair{&a.q, &qu}, std::pair{&a.r, &ru}}) {
      if (four) break;
      to->resize(from->size());
      for (size_t i = 0; i < from->size(); ++i) (*to)[i] = static_cast<uint8_t>((*from)[i]) ^ 0x80;
    }
    const llmserve::qdot::Operands o{M, K, G, N, a.q.data(), a.r.data(), qu.data(), ru.data(), a.u.data(),
                                     a.s.data(), a.c.data(), cp, sp, op, std::is_same_v<S, at::Half>, Fine, four, yp,
                                     a.xo.data(), reinterpret_cast<const uint16_t*>(wo), ko};
    at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) { llmserve::qdot::vnni_tiles(o, t0, t1); });
    return y;
  }
  at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* c = cp + t * G * Codes::kGroupBytes;
      const S *s = sp + t * G * kTile, *o = op + t * G * kTile;
      if constexpr (Fine) {  // two accumulators a row: half the rows a pass
        for (int64_t m = 0; m < M; m += 2) {
          if (M - m == 1) tile_rows<Codes, S, 1, true>(a, m, c, s, o, yp, N, t * kTile, wo);
          else tile_rows<Codes, S, 2, true>(a, m, c, s, o, yp, N, t * kTile, wo);
        }
      } else {
        for (int64_t m = 0; m < M; m += kRowsPerPass) {
          switch (std::min(kRowsPerPass, M - m)) {
            case 1: tile_rows<Codes, S, 1, false>(a, m, c, s, o, yp, N, t * kTile, wo); break;
            case 2: tile_rows<Codes, S, 2, false>(a, m, c, s, o, yp, N, t * kTile, wo); break;
            case 3: tile_rows<Codes, S, 3, false>(a, m, c, s, o, yp, N, t * kTile, wo); break;
            default: tile_rows<Codes, S, 4, false>(a, m, c, s, o, yp, N, t * kTile, wo); break;
          }
        }
      }
    }
  });
  return y;
}

template <class Codes>
at::Tensor dispatch(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t N,
                       bool fine, const std::optional<at::Tensor>& chans_, const std::optional<at::Tensor>& wo_) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a 2-D float32 tensor");
  const int64_t K = x.size(1), G = K / kGroup, tiles = (N + kTile - 1) / kTile;
  TORCH_CHECK(K % kGroup == 0 && codes.is_contiguous() && codes.numel() == tiles * G * Codes::kGroupBytes,
              "codes must be contiguous, ceil(N / 8) tiles of K / 32 groups, and K a multiple of 32");
  TORCH_CHECK(scale.scalar_type() == offset.scalar_type() && scale.is_contiguous() && offset.is_contiguous() &&
                  scale.numel() == tiles * G * kTile && offset.numel() == tiles * G * kTile,
              "scale and offset must be contiguous [ceil(N / 8), K / 32, 8] of one dtype");
  const bool half = scale.scalar_type() == at::kHalf;
  TORCH_CHECK(half || scale.scalar_type() == at::kFloat, "scale and offset must be float32 or float16");
  at::Tensor chans, wo;
  if (chans_ && chans_->numel() > 0) {
    chans = chans_->contiguous();
    TORCH_CHECK(chans.scalar_type() == at::kLong && chans.dim() == 1, "chans must be a 1-D int64 tensor");
    const int64_t ko = chans.numel();
    // (a plain loop, not min() / max(): two tensor reductions a layer a step on the hot path)
    const int64_t* cp = chans.data_ptr<int64_t>();
    for (int64_t j = 0; j < ko; ++j) TORCH_CHECK(cp[j] >= 0 && cp[j] < K, "chans must lie in [0, K)");
    TORCH_CHECK(wo_ && wo_->scalar_type() == at::kHalf && wo_->is_contiguous() && wo_->numel() == tiles * ko * kTile,
                "wo must be contiguous float16 [ceil(N / 8), len(chans), 8]");
    wo = *wo_;
  }
  if constexpr (Codes::kShifted) {  // (seven bits: one byte only)
    TORCH_CHECK(!fine, "seven-bit activations are one byte: fine must be false");
    return half ? run<Codes, at::Half, false>(x, codes, scale, offset, N, chans, wo)
                : run<Codes, float, false>(x, codes, scale, offset, N, chans, wo);
  } else {
    if (half)
      return fine ? run<Codes, at::Half, true>(x, codes, scale, offset, N, chans, wo)
                  : run<Codes, at::Half, false>(x, codes, scale, offset, N, chans, wo);
    return fine ? run<Codes, float, true>(x, codes, scale, offset, N, chans, wo)
                : run<Codes, float, false>(x, codes, scale, offset, N, chans, wo);
  }
}

}  // namespace

// x [M, K] float32; nibbles: qlayout's 4-bit codes (uint8, ceil(N / 8) * K * 4 bytes);
// scale, offset [ceil(N / 8), K / 32, 8] float16 or float32; fine: two-byte activations;
// chans (int64 [ko], optional): outlier channels, taken on fp32 activations and wo (float16
// [ceil(N / 8), ko, 8], those columns of W) -> [M, N].
at::Tensor q4_linear(at::Tensor x, at::Tensor nibbles, at::Tensor scale, at::Tensor offset, int64_t N,
                        bool fine, std::optional<at::Tensor> chans, std::optional<at::Tensor> wo) {
  TORCH_CHECK(nibbles.scalar_type() == at::kByte, "nibbles must be uint8");
  return dispatch<Q4>(x, nibbles, scale, offset, N, fine, chans, wo);
}

// x [M, K] float32; codes: qlayout's 8-bit codes (int8, ceil(N / 8) * K * 8 bytes); bits: the
// one-byte activations' bits, 8 or 7 (not fine); the rest as above.
at::Tensor q8_linear(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor offset, int64_t N,
                        bool fine, std::optional<at::Tensor> chans, std::optional<at::Tensor> wo, int64_t bits) {
  TORCH_CHECK(codes.scalar_type() == at::kChar, "codes must be int8");
  TORCH_CHECK(bits == 8 || bits == 7, "bits must be 8 or 7");
  if (bits == 7) return dispatch<Q8Seven>(x, codes.view(at::kByte), scale, offset, N, fine, chans, wo);
  return dispatch<Q8>(x, codes.view(at::kByte), scale, offset, N, fine, chans, wo);
}

// Whether q4_linear / q8_linear take the AVX-512 VNNI path: where the CPU has it unless
// turned off (for tests and comparisons: both paths give the same bits).
bool int8_vnni(bool enable) {
  use_vnni = enable && llmserve::qdot::vnni_supported();
  return use_vnni;
}

bool int8_vnni_active() { return use_vnni; }

// The activations as the kernels see them (for tests): q [M, K] int8, r [M, K] int8 (zeros
// unless fine), xd = absmax / 127 (63 at seven bits) and the exact sums xs [M, K / 32]:
// x ~ xd * (q + r / 128).
std::vector<at::Tensor> quantize_activations(at::Tensor x, bool fine, int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) % kGroup == 0,
              "x must be float32 [M, K] with K a multiple of 32");
  TORCH_CHECK(bits == 8 || (bits == 7 && !fine), "bits must be 8, or 7 when not fine");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup;
  const Acts a(x.data_ptr<float>(), M, K, fine, nullptr, 0, static_cast<int>(bits));
  auto q = at::empty({M, K}, x.options().dtype(at::kChar));
  auto r = at::zeros({M, K}, x.options().dtype(at::kChar));
  auto d = at::empty({M, G}, x.options()), s = at::empty({M, G}, x.options());
  std::copy(a.q.begin(), a.q.end(), q.data_ptr<int8_t>());
  std::copy(a.r.begin(), a.r.end(), r.data_ptr<int8_t>());
  for (int64_t i = 0; i < M * G; ++i) d.data_ptr<float>()[i] = a.u[i] * (fine ? 128.f : 1.f);
  std::copy(a.s.begin(), a.s.end(), s.data_ptr<float>());
  return {q, r, d, s};
}
