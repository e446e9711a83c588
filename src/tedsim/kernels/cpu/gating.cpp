// Fused CPU gating. Pass 1 streams the logits once: max, exp, normalize (vectorized via omp simd
// and fast_exp), per-expert probability sums, and the top-k choices with an insertion scan.
// Pass 2 walks only the small [T,k] choice array to assign capacity positions and weights.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/fast_math.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gating_common.hpp"

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

}  // namespace detail

void gating_forward(const float* logits, int tokens, int experts, const GatingConfig& cfg, GatingOutput& out) {
  detail::check_gating_args(tokens, experts, cfg);
  detail::prepare_output(tokens, experts, cfg, out);
  const int k = cfg.k;
  const std::size_t E = experts;
  // Per-expert probability sums: float partials over blocks of tokens, flushed into doubles, so the
  // inner loop stays vectorized and the mean stays accurate for large T.
  std::vector<float> block_sum(E, 0.0f);
  std::vector<double> prob_sum(E, 0.0);
  constexpr int kBlock = 256;

  for (int t = 0; t < tokens; ++t) {
    const float* x = logits + t * E;
    float* p = out.probs.data() + t * E;

    // Top-k by insertion: strict '>' keeps the earlier (lower) index ahead on ties. For random
    // logits almost every element fails the first comparison, so this costs ~1 compare/element.
    float best_v[kMaxTopK] = {};
    int best_i[kMaxTopK] = {};
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
    std::int32_t* ex = out.expert.data() + static_cast<std::size_t>(t) * k;
    for (int j = 0; j < k; ++j) ex[j] = best_i[j];
    ++out.top1_count[best_i[0]];

    const float m = best_v[0];
    const float s = detail::exp_shifted_row(x, m, p, E);
    const float inv = 1.0f / s;
    float* bs = block_sum.data();
#pragma omp simd
    for (std::size_t e = 0; e < E; ++e) {
      p[e] *= inv;
      bs[e] += p[e];
    }
    if ((t + 1) % kBlock == 0 || t + 1 == tokens) {
      for (std::size_t e = 0; e < E; ++e) {
        prob_sum[e] += block_sum[e];
        block_sum[e] = 0.0f;
      }
    }
  }

  detail::assign_positions_and_weights(out);
  double aux = 0.0;
  if (tokens > 0) {
    for (std::size_t e = 0; e < E; ++e) {
      aux += (prob_sum[e] / tokens) * (static_cast<double>(out.top1_count[e]) / tokens);
    }
  }
  out.aux_loss = aux * experts;
}

}  // namespace tedsim::kernels
