#pragma once
// Gating's pass 1 (gating.cpp: the plan, the portable pass and pass 2; gating_rows.cpp: the AVX2
// row kernel; gating_transposed.cpp: the AVX2 transposed kernels for small expert counts): the
// pieces they share. Internal to the gating kernels.
#include <cstddef>
#include <cstdint>

#include "tedsim/kernels/cpu/gating.hpp"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace tedsim::kernels::detail {

// Per-expert probability sums: float partials over blocks of tokens, flushed into doubles, so the
// inner loop stays vectorized and the mean stays accurate for large T.
constexpr int kSumBlock = 256;

// Top-k of one row by insertion: strict '>' keeps the earlier (lower) index ahead on ties. Used by
// the portable path, and by the vector path for rows whose maximum it cannot locate (NaN logits).
inline void topk_scan(const float* x, std::size_t E, int k, float* best_v, int* best_i) {
  int filled = 0;
  // The k-th best so far, kept in a register: reading best_v[k-1] from the stack on every
  // element cost a store-forwarding round trip per comparison.
  float threshold = 0.0f;
  for (std::size_t e = 0; e < E; ++e) {
    const float v = x[e];
    if (filled == k && !(v > threshold)) continue;
    int slot = filled < k ? filled++ : k - 1;
    while (slot > 0 && v > best_v[slot - 1]) {
      best_v[slot] = best_v[slot - 1];
      best_i[slot] = best_i[slot - 1];
      --slot;
    }
    best_v[slot] = v;
    best_i[slot] = static_cast<int>(e);
    threshold = best_v[k - 1];
  }
}

#if defined(__AVX2__) && defined(__FMA__)

// exp(-d) for d >= 0 (d = row max - logit) for the softmax of the row kernel: exp_neg256's range
// reduction with a degree-4 polynomial for 2^f, f in [-1/2, 1/2] (minimax for relative error,
// constant term 1 so exp(-0) is exactly 1). Max relative error 3.6e-6 (exp_neg256: 3.7e-7): a
// probability's relative error stays below ~7.5e-6 (the sum's error partly cancels), inside the
// tests' 1e-5 against the fp64 reference. One FMA fewer per 8 logits than exp_neg256: the gating
// kernels are bound by instruction throughput, and the exponential is about a third of it.
// NaN inputs are not guaranteed to stay NaN (callers check the logits themselves).
inline __m256 exp_neg256_softmax(__m256 d) {
  const __m256 magic = _mm256_set1_ps(12582912.0f), log2e = _mm256_set1_ps(1.44269504088896341f);
  d = _mm256_castsi256_ps(_mm256_min_epi32(_mm256_castps_si256(d), _mm256_castps_si256(_mm256_set1_ps(86.6f))));
  const __m256 u = _mm256_fnmadd_ps(d, log2e, magic);                     // n + 1.5*2^23
  const __m256 f = _mm256_fnmsub_ps(d, log2e, _mm256_sub_ps(u, magic));  // -d*log2e - n
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.009782912553463786f), f, _mm256_set1_ps(0.055976883627089156f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24020711078853738f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931136044039088f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  return _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(u), 23)));
}

// One token by the scalar route, adding its probabilities straight into the fp64 sums: the vector
// kernel's tail tokens (T % 8) and any group with a row whose maximum no lane equals (NaN logits).
void row_scalar(const float* x, std::size_t E, int k, float* p, std::int32_t* ex, float* w, std::int32_t* top1,
                double* prob_sum);

// The row kernel (gating_rows.cpp): true when it handled this width (E <= 64 experts).
bool pass1_vector(const float* logits, int tokens, GatingOutput& out, double* prob_sum);
// The transposed kernel (gating_transposed.cpp): true when it handled this width (E % 4 == 0, E <= 32).
bool pass1_transposed(const float* logits, int tokens, GatingOutput& out, double* prob_sum);
// E = 16 with k <= 2, one token per row of two ymm (gating_transposed.cpp).
void pass1_e16_by_k(const float* logits, int tokens, GatingOutput& out, double* prob_sum);

#endif  // __AVX2__ && __FMA__

}  // namespace tedsim::kernels::detail
