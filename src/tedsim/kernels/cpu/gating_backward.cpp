// Backward of gating. d(loss)/d(probs) collects two terms, then the softmax Jacobian maps it to
// the logits: dlogit = p * (dp - <dp, p>).
//  * combine weights: k == 1: w = p[e] -> dp[e] += g.  k >= 2: w_j = p_j / S over kept choices
//    (S = sum of kept p, clamped at FLT_EPSILON) -> dp_j += g_j / S - <g, p_kept> / S^2 (when the
//    clamp is active S is a constant and only g_j / S remains).
//  * aux loss: aux = E * sum_e (sum_t p[t,e] / T) * ce_e with ce_e constant
//    -> dp[t,e] += grad_aux * E * ce_e / T (T: the aux loss's tokens, a group's under SP).
#include <cfloat>
#include <vector>

#include "tedsim/kernels/cpu/gating.hpp"

namespace tedsim::kernels {

void gating_backward(const GatingOutput& fwd, const float* grad_weight, float grad_aux, float* grad_logits) {
  const int T = fwd.tokens, E = fwd.experts, k = fwd.k;
  if (T == 0) return;
  const int Ta = fwd.aux_tokens > 0 ? fwd.aux_tokens : T;  // the aux loss's tokens (a group's under SP)
  std::vector<float> aux_term(E);
  for (int e = 0; e < E; ++e) {
    const double ce = static_cast<double>(fwd.top1_count[e]) / Ta;
    aux_term[e] = static_cast<float>(static_cast<double>(grad_aux) * E * ce / Ta);
  }
  std::vector<float> dp(E);
  for (int t = 0; t < T; ++t) {
    const float* p = fwd.probs.data() + static_cast<std::size_t>(t) * E;
    const float* g = grad_weight + static_cast<std::size_t>(t) * k;
    const std::int32_t* ex = fwd.expert.data() + static_cast<std::size_t>(t) * k;
    const std::int32_t* pos = fwd.position.data() + static_cast<std::size_t>(t) * k;
    for (int e = 0; e < E; ++e) dp[e] = aux_term[e];
    if (k == 1) {
      if (pos[0] >= 0) dp[ex[0]] += g[0];
    } else {
      float s = 0.0f, gp = 0.0f;
      for (int j = 0; j < k; ++j) {
        if (pos[j] < 0) continue;
        s += p[ex[j]];
        gp += g[j] * p[ex[j]];
      }
      const bool clamped = s < FLT_EPSILON;
      const float denom = clamped ? FLT_EPSILON : s;
      for (int j = 0; j < k; ++j) {
        if (pos[j] < 0) continue;
        dp[ex[j]] += g[j] / denom - (clamped ? 0.0f : gp / (denom * denom));
      }
    }
    float dot = 0.0f;
    for (int e = 0; e < E; ++e) dot += dp[e] * p[e];
    float* gl = grad_logits + static_cast<std::size_t>(t) * E;
    for (int e = 0; e < E; ++e) gl[e] = p[e] * (dp[e] - dot);
  }
}

}  // namespace tedsim::kernels
