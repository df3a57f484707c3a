// The AVX2 int8 dot's ceiling on this CPU, one core, all in L1: 4 rows against a tile's 4-bit
// codes as qdot_linear.cpp's one-byte dot reads them, with one tile per broadcast of a row's
// bytes (the kernel's way) and with two (each broadcast feeding 16 outputs). If the second is
// no faster, the broadcasts are not what binds; the byte multiplier is.
//
//   g++ -O3 -mavx2 -mfma -o /tmp/maddubs_peak benchmarks/engine/maddubs_peak.cpp && /tmp/maddubs_peak
//
// 2026-12-04 EPYC (AVX-512 VNNI CPU, this AVX2 code): 172-177 G MAC/s a tile, 177-182 two;
// the kernel reaches ~102 G MAC/s a core on SmolLM2's qkv at 64 rows (one byte), the rest going
// to each group's float epilogue and the weights' stream (docs/performance.md, History).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <vector>
constexpr int R = 4;
__attribute__((noinline)) __m256i run_bcast(const uint8_t* w, const int8_t* x, long groups) {
  const __m256i m = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i tot = _mm256_setzero_si256();
  for (long g = 0; g < groups; ++g) {
    const uint8_t* wg = w + (g % 64) * 128; const int8_t* xg = x + (g % 64) * 32;
    __m256i a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(wg + 32 * i));
      const __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
      for (int r = 0; r < R; ++r) {
        a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(*(const int32_t*)(xg + r * 2048 + 8 * i))));
        a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(*(const int32_t*)(xg + r * 2048 + 8 * i + 4))));
      }
    }
    for (int r = 0; r < R; ++r) tot = _mm256_add_epi32(tot, _mm256_madd_epi16(a[r], ones));
  }
  return tot;
}
// two tiles per broadcast: each broadcast feeds 2 maddubs (16 outputs)
__attribute__((noinline)) __m256i run_two(const uint8_t* w, const int8_t* x, long groups) {
  const __m256i m = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i tot = _mm256_setzero_si256();
  for (long g = 0; g < groups; g += 2) {
    const uint8_t* wg = w + (g % 64) * 128; const int8_t* xg = x + (g % 64) * 32;
    __m256i a[R], b[R];
    for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(wg + 32 * i)), u = _mm256_loadu_si256((const __m256i*)(wg + 8192 + 32 * i));
      const __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
      const __m256i lo2 = _mm256_and_si256(u, m), hi2 = _mm256_and_si256(_mm256_srli_epi16(u, 4), m);
      for (int r = 0; r < R; ++r) {
        const __m256i x0 = _mm256_set1_epi32(*(const int32_t*)(xg + r * 2048 + 8 * i)), x1 = _mm256_set1_epi32(*(const int32_t*)(xg + r * 2048 + 8 * i + 4));
        a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(lo, x0));
        a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(hi, x1));
        b[r] = _mm256_add_epi16(b[r], _mm256_maddubs_epi16(lo2, x0));
        b[r] = _mm256_add_epi16(b[r], _mm256_maddubs_epi16(hi2, x1));
      }
    }
    for (int r = 0; r < R; ++r) tot = _mm256_add_epi32(tot, _mm256_add_epi32(_mm256_madd_epi16(a[r], ones), _mm256_madd_epi16(b[r], ones)));
  }
  return tot;
}
int main() {
  std::vector<uint8_t> w(1 << 16, 0x37); std::vector<int8_t> x(1 << 14, 3);
  const long groups = 20000000;
  for (int rep = 0; rep < 3; ++rep) {
    for (int k = 0; k < 2; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      __m256i r = k == 0 ? run_bcast(w.data(), x.data(), groups) : run_two(w.data(), x.data(), groups);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // MACs: groups * 8 outputs * 32 * R
      double macs = double(groups) * 8 * 32 * R;
      printf("%s: %.1f G MAC/s (%d)\n", k == 0 ? "one tile/bcast " : "two tiles/bcast", macs / s / 1e9, _mm256_extract_epi32(r, 0) & 1);
    }
  }
}
