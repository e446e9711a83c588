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

#if defined(__AVX2__) && defined(__FMA__)
// exp(-d) for d >= 0 (d = max - logit), 8 lanes, for the gating softmax. Written for Zen 3's
// pipes: FMA/mul, FP compare/max/blend share two of the four FP pipes and are what a gating
// kernel runs out of first, so only 7 of the 12 ops go there (fast_exp's AVX2 form needs 10).
// - Clamp d <= 86.6 as an integer min on the bits (any pipe); non-negative floats order like
//   their bit patterns, and +inf is clamped too. exp(-86.6) ~ 2^-125, a zero probability.
// - t = -d*log2(e) = n + f, n = round(t), f in [-1/2, 1/2]: adding 1.5*2^23 rounds t to an integer
//   in the low mantissa bits (u), u - 1.5*2^23 is n exactly, and f = -d*log2(e) - n is one FMA
//   (one rounding).
// - 2^f: degree-5 polynomial fitted for relative error.
// - 2^n * p as an integer add of n << 23 (u << 23: the low bits of u are n in two's complement)
//   to p's exponent field; p in [0.7, 1.42] and n >= -125 keep the result a normal float.
// Max relative error 3.7e-7 for d < 16 (probabilities above 1e-7), 1.3e-6 down to the clamp;
// exp(-0) is exactly 1. A NaN d with the sign bit set (the x86 default NaN, e.g. inf - inf) stays
// NaN; callers that must see every NaN check the logits themselves.
inline __m256 exp_neg256(__m256 d) {
  const __m256 magic = _mm256_set1_ps(12582912.0f), log2e = _mm256_set1_ps(1.44269504088896341f);
  d = _mm256_castsi256_ps(_mm256_min_epi32(_mm256_castps_si256(d), _mm256_castps_si256(_mm256_set1_ps(86.6f))));
  const __m256 u = _mm256_fnmadd_ps(d, log2e, magic);              // n + 1.5*2^23
  const __m256 f = _mm256_fnmsub_ps(d, log2e, _mm256_sub_ps(u, magic));  // -d*log2e - n
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.0013264724984765053f), f, _mm256_set1_ps(0.009671513922512531f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.05550733581185341f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24022242426872253f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931470036506653f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  return _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(u), 23)));
}
#endif

}  // namespace tedsim::kernels::detail
