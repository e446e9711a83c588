// Fused CPU gating. Pass 1 streams the logits once, token by token: max, top-k, exp, normalize,
// per-expert probability sums, and the raw probabilities of the chosen experts. Pass 2 walks only
// the small [T,k] choice arrays to assign capacity positions and finish the combine weights.
//
// Why it looks like this (measured with calibrate/bench_kernels, BM_GatingCpu vs_memcpy):
// - The old single scalar scan did top-k with a data-dependent branch per element (a mispredict
//   every time the running top-k changed) and reached 2-10% of a memcpy of the logits.
// - With AVX2+FMA a row of E <= 64 experts is 1..8 ymm registers, handled 8 tokens at a time so
//   the horizontal max / sum / divide are done once per group (pass1_rows). Top-k works on the
//   logits in value passes (each pass takes every lane equal to its maximum, so ties go to the
//   lowest index and cost nothing extra); for k > 2 the passes carry values only and one sweep
//   plus a rank per chosen lane orders the choices. (AVX-512 would halve the register count, but
//   the build machines are Zen 3: AVX2 only.)
// - The row kernel is bound by instruction throughput (~3 instructions per cycle on Zen 3, about
//   270 per token at E = 64, k = 1), a third of it the exponential, hence a degree-4 polynomial
//   for 2^f (exp_neg256_softmax; the earlier row kernel used a degree-6 exp with floor). Against
//   the earlier row kernel, in the same runs: E = 64 k = 1, 2 about 1.3x (with the streaming
//   stores at 16 MiB), k = 8 about 2.4x (value passes).
// - Reading the chosen probabilities back for the weights while the row is in L1, instead of
//   gathering them from the [T,E] probs in pass 2, removes T*k cache misses.
// The portable path (no AVX2/FMA, or E > 64) keeps the scalar insertion scan; tests check
// both paths against the fp64 reference. This file holds the plan, the portable pass and pass 2;
// the row kernel is gating_rows.cpp and the transposed kernels gating_transposed.cpp.
// - E % 4 == 0 and E <= 32 take the transposed kernel (pass1_avx2_transposed): 8 tokens per group
//   transposed so each ymm holds one expert for the 8 tokens; max / top-k / exp / sum are vertical,
//   the first choices' positions are assigned in pass 1 (token order), top1_count = routed after
//   them, and pass 2 only walks choices j >= 1. E = 16: 3.2 -> ~7 GB/s (vs_memcpy 0.10 -> ~0.22);
//   ~92 instructions per token at k = 1 (~30 cycles), a third of them the exponential; the row
//   kernel at E = 16 measured slower (12.8 vs 10.7 ns per token at k = 1). E = 16 with k <= 2
//   takes pass1_e16 instead: one token per row of two ymm, software-pipelined over tokens;
//   1.12-1.2x the transposed kernel in the same process (k = 1: 86 instructions per token against
//   91, k = 2: 124 against 125; the gain is the shorter dependency chains, not the count).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/fast_math.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gating_common.hpp"
#include "tedsim/kernels/cpu/gating_passes.hpp"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace tedsim::kernels {

int capacity(std::int64_t tokens, int experts, int k, double factor, int min_capacity) {
  if (experts <= 0 || k <= 0 || tokens < 0 || !(factor >= 0.0) || min_capacity < 0) {
    throw InputError("capacity: need experts > 0, k > 0, tokens >= 0, factor >= 0, min_capacity >= 0 (got E=" +
                     std::to_string(experts) + " k=" + std::to_string(k) + " T=" + std::to_string(tokens) +
                     " f=" + std::to_string(factor) + ")");
  }
  const double exact = static_cast<double>(k) * factor * static_cast<double>(tokens) / experts;
  // A relative guard so that e.g. 1.1*T/E that is an integer in decimal does not ceil one too high.
  const auto c = static_cast<std::int64_t>(std::ceil(exact * (1.0 - 1e-12)));
  return static_cast<int>(std::max<std::int64_t>(c, min_capacity));
}

namespace detail {

void check_gating_args(int tokens, int experts, const GatingConfig& cfg) {
  if (tokens < 0 || experts <= 0 || cfg.k < 1 || cfg.k > kMaxTopK || cfg.k > experts) {
    throw InputError("gating: need tokens >= 0, experts > 0, 1 <= k <= min(" + std::to_string(kMaxTopK) +
                     ", experts) (got T=" + std::to_string(tokens) + " E=" + std::to_string(experts) +
                     " k=" + std::to_string(cfg.k) + ")");
  }
}

void prepare_output(int tokens, int experts, const GatingConfig& cfg, GatingOutput& out) {
  out.tokens = tokens;
  out.aux_tokens = 0;
  out.experts = experts;
  out.k = cfg.k;
  out.capacity = cfg.drop_tokens ? capacity(tokens, experts, cfg.k, cfg.capacity_factor, cfg.min_capacity)
                                 : std::max(cfg.k * tokens, cfg.min_capacity);
  const auto tk = static_cast<std::size_t>(tokens) * cfg.k;
  out.probs.resize(static_cast<std::size_t>(tokens) * experts);
  out.expert.resize(tk);
  out.position.resize(tk);
  out.weight.resize(tk);
  out.routed.assign(experts, 0);
  out.kept.assign(experts, 0);
  out.top1_count.assign(experts, 0);
}

void assign_positions_and_weights(GatingOutput& out) {
  const int T = out.tokens, k = out.k, C = out.capacity;
  // j-major walk: every token's j-th choice is placed before any (j+1)-th choice.
  for (int j = 0; j < k; ++j) {
    for (int t = 0; t < T; ++t) {
      const std::size_t i = static_cast<std::size_t>(t) * k + j;
      const int e = out.expert[i];
      const int pos = out.routed[e]++;
      if (pos < C) {
        out.position[i] = pos;
        ++out.kept[e];
      } else {
        out.position[i] = -1;
      }
    }
  }
  const std::size_t E = out.experts;
  for (int t = 0; t < T; ++t) {
    const float* p = out.probs.data() + t * E;
    float* w = out.weight.data() + static_cast<std::size_t>(t) * k;
    const std::int32_t* ex = out.expert.data() + static_cast<std::size_t>(t) * k;
    const std::int32_t* pos = out.position.data() + static_cast<std::size_t>(t) * k;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      w[j] = pos[j] >= 0 ? p[ex[j]] : 0.0f;
      sum += w[j];
    }
    if (k >= 2) {
      const float inv = 1.0f / std::max(sum, FLT_EPSILON);
      for (int j = 0; j < k; ++j) w[j] *= inv;
    }
  }
}

namespace {

// Pass 2 of the fused kernels. On entry expert[] holds the choices and weight[] the raw softmax
// probability of each choice; routed/kept are zero, or (first_done) the first choices already have
// positions and drops (routed counts them, top1_count is set). Positions in j-major order (all
// j-th choices of all tokens before any (j+1)-th), then drops zeroed and k >= 2 weights
// renormalized.
void assign_positions_fused(GatingOutput& out, bool first_done) {
  const int T = out.tokens, k = out.k, C = out.capacity;
  std::int32_t* routed = out.routed.data();
  const std::int32_t* ex = out.expert.data();
  std::int32_t* position = out.position.data();
  float* weight = out.weight.data();
  for (int j = first_done ? 1 : 0; j < k; ++j) {
    for (int t = 0; t < T; ++t) {
      const std::size_t i = static_cast<std::size_t>(t) * k + j;
      const int pos = routed[ex[i]]++;
      const bool keep = pos < C;
      position[i] = keep ? pos : -1;
      weight[i] = keep ? weight[i] : 0.0f;
    }
  }
  for (int e = 0; e < out.experts; ++e) out.kept[e] = std::min(routed[e], C);
  if (k >= 2) {
    int t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (k == 2) {
      // 4 tokens per ymm: each lane pair's sum via an in-pair swap, the same sum w0 + w1, clamp,
      // divide and products as the scalar loop (bit-identical).
      const __m256 eps = _mm256_set1_ps(FLT_EPSILON), one = _mm256_set1_ps(1.0f);
      for (; t + 4 <= T; t += 4) {
        float* w = weight + static_cast<std::size_t>(t) * 2;
        const __m256 v = _mm256_loadu_ps(w);
        const __m256 sum = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
        _mm256_storeu_ps(w, _mm256_mul_ps(v, _mm256_div_ps(one, _mm256_max_ps(sum, eps))));
      }
    }
#endif
    for (; t < T; ++t) {
      float* w = weight + static_cast<std::size_t>(t) * k;
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += w[j];
      const float inv = 1.0f / std::max(sum, FLT_EPSILON);
      for (int j = 0; j < k; ++j) w[j] *= inv;
    }
  }
}

double finish_aux(const GatingOutput& out, const double* prob_sum) {
  const int T = out.tokens;
  double aux = 0.0;
  if (T > 0) {
    for (int e = 0; e < out.experts; ++e) {
      aux += (prob_sum[e] / T) * (static_cast<double>(out.top1_count[e]) / T);
    }
  }
  return aux * out.experts;
}

// Portable pass 1 (scalar top-k, exp row via fast_math's AVX2/scalar exp).
void pass1_portable(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  const int k = out.k;
  const std::size_t E = out.experts;
  std::vector<float> block_sum(E, 0.0f);
  float* bs = block_sum.data();
  for (int t = 0; t < tokens; ++t) {
    const float* x = logits + t * E;
    float* p = out.probs.data() + t * E;
    float best_v[kMaxTopK] = {};
    int best_i[kMaxTopK] = {};
    topk_scan(x, E, k, best_v, best_i);
    const float m = best_v[0];
    const float s = exp_shifted_row(x, m, p, E);
    const float inv = 1.0f / s;
#pragma omp simd
    for (std::size_t e = 0; e < E; ++e) {
      p[e] *= inv;
      bs[e] += p[e];
    }
    std::int32_t* ex = out.expert.data() + static_cast<std::size_t>(t) * k;
    float* w = out.weight.data() + static_cast<std::size_t>(t) * k;
    for (int j = 0; j < k; ++j) {
      ex[j] = best_i[j];
      w[j] = p[best_i[j]];
    }
    ++out.top1_count[best_i[0]];
    if ((t + 1) % kSumBlock == 0 || t + 1 == tokens) {
      for (std::size_t e = 0; e < E; ++e) {
        prob_sum[e] += bs[e];
        bs[e] = 0.0f;
      }
    }
  }
}

void gating_forward_impl(const float* logits, int tokens, int experts, const GatingConfig& cfg, GatingOutput& out,
                         bool allow_vector) {
  check_gating_args(tokens, experts, cfg);
  prepare_output(tokens, experts, cfg, out);
  std::vector<double> prob_sum(experts, 0.0);
  bool done = false, first_done = false;
#if defined(__AVX2__) && defined(__FMA__)
  if (allow_vector) {
    if (experts == 16 && cfg.k <= 2) {
      pass1_e16_by_k(logits, tokens, out, prob_sum.data());
      done = first_done = true;
    }
    if (!done) done = first_done = pass1_transposed(logits, tokens, out, prob_sum.data());
    if (!done) done = pass1_vector(logits, tokens, out, prob_sum.data());
  }
#else
  (void)allow_vector;
#endif
  if (!done) pass1_portable(logits, tokens, out, prob_sum.data());
  assign_positions_fused(out, first_done);
  out.aux_loss = finish_aux(out, prob_sum.data());
}

}  // namespace

void gating_forward_portable(const float* logits, int tokens, int experts, const GatingConfig& cfg,
                             GatingOutput& out) {
  gating_forward_impl(logits, tokens, experts, cfg, out, false);
}

bool gating_has_vector_path(int experts) {
#if defined(__AVX2__) && defined(__FMA__)
  return experts > 0 && experts <= 64;
#else
  (void)experts;
  return false;
#endif
}

}  // namespace detail

void gating_forward(const float* logits, int tokens, int experts, const GatingConfig& cfg, GatingOutput& out) {
  detail::gating_forward_impl(logits, tokens, experts, cfg, out, true);
}

}  // namespace tedsim::kernels
