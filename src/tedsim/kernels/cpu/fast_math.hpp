#pragma once
// Vectorizable exp for softmax: std::exp does not vectorize without -ffast-math, and the gating
// and attention softmaxes are bound by it. Range reduction x = n*ln2 + r, |r| <= ln2/2, then a
// degree-6 polynomial: relative error ~2e-7 for the x <= 0 inputs a max-subtracted softmax sees.
#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace tedsim::kernels::detail {

inline float fast_exp(float x) {
  // Two flat selects (not a nested ternary) so GCC if-converts them to vmaxps/vminps.
  x = x > -87.0f ? x : -87.0f;
  x = x < 88.0f ? x : 88.0f;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // two-part ln2 keeps r exact
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// y[i] = exp(x[i] - m) for i < n; returns the sum of y. GCC does not reliably vectorize the
// scalar fast_exp inside a loop (it kept the scalar path in measurements), so the hot softmax
// rows use AVX2 intrinsics with the same range reduction and polynomial when available.
inline float exp_shifted_row(const float* x, float m, float* y, std::size_t n) {
  std::size_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 vm = _mm256_set1_ps(m), lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), half = _mm256_set1_ps(0.5f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 c6 = _mm256_set1_ps(1.0f / 720.0f), c5 = _mm256_set1_ps(1.0f / 120.0f),
               c4 = _mm256_set1_ps(1.0f / 24.0f), c3 = _mm256_set1_ps(1.0f / 6.0f), one = _mm256_set1_ps(1.0f);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(v, log2e, half));
    const __m256 r = _mm256_fnmadd_ps(k, ln2_lo, _mm256_fnmadd_ps(k, ln2_hi, v));
    __m256 p = _mm256_fmadd_ps(c6, r, c5);
    p = _mm256_fmadd_ps(p, r, c4);
    p = _mm256_fmadd_ps(p, r, c3);
    p = _mm256_fmadd_ps(p, r, half);
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) sum += l;
#endif
  for (; i < n; ++i) {
    y[i] = fast_exp(x[i] - m);
    sum += y[i];
  }
  return sum;
}

}  // namespace tedsim::kernels::detail
