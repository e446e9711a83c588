// Plain reference gating, written the way DeepSpeed's sharded_moe expresses it (one-hot masks and
// cumulative sums), independently of the fused kernel's loops, so tests compare two algorithms.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gating_common.hpp"

namespace tedsim::kernels {

void gating_forward_reference(const float* logits, int tokens, int experts, const GatingConfig& cfg,
                              GatingOutput& out) {
  detail::check_gating_args(tokens, experts, cfg);
  detail::prepare_output(tokens, experts, cfg, out);
  const int T = tokens, E = experts, k = cfg.k, C = out.capacity;

  // Softmax in fp64.
  for (int t = 0; t < T; ++t) {
    double m = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < E; ++e) m = std::max(m, static_cast<double>(logits[t * E + e]));
    double s = 0.0;
    for (int e = 0; e < E; ++e) s += std::exp(logits[t * E + e] - m);
    for (int e = 0; e < E; ++e) out.probs[t * E + e] = static_cast<float>(std::exp(logits[t * E + e] - m) / s);
  }
  // Choice j = argmax over the experts not yet chosen; first maximum wins (lowest index).
  std::vector<std::vector<int>> mask(k, std::vector<int>(static_cast<std::size_t>(T) * E, 0));
  for (int t = 0; t < T; ++t) {
    std::vector<bool> taken(E, false);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (taken[e]) continue;
        if (best < 0 || logits[t * E + e] > logits[t * E + best]) best = e;
      }
      taken[best] = true;
      out.expert[t * k + j] = best;
      mask[j][t * E + best] = 1;
    }
  }
  // locations_j = cumsum over tokens of mask_j - 1 + (sum of all earlier masks over all tokens).
  std::vector<int> offset(E, 0);
  for (int j = 0; j < k; ++j) {
    std::vector<int> cumsum(E, 0);
    for (int t = 0; t < T; ++t) {
      for (int e = 0; e < E; ++e) {
        cumsum[e] += mask[j][t * E + e];
        if (mask[j][t * E + e]) {
          const int loc = cumsum[e] - 1 + offset[e];
          out.position[t * k + j] = loc < C ? loc : -1;
        }
      }
    }
    for (int e = 0; e < E; ++e) offset[e] += cumsum[e];
  }
  for (int e = 0; e < E; ++e) {
    out.routed[e] = offset[e];
    out.kept[e] = std::min(offset[e], C);
  }
  // Weights: raw probability for k == 1, renormalized over kept choices for k >= 2.
  for (int t = 0; t < T; ++t) {
    double denom = 0.0;
    for (int j = 0; j < k; ++j) {
      if (out.position[t * k + j] >= 0) denom += out.probs[t * E + out.expert[t * k + j]];
    }
    denom = std::max(denom, static_cast<double>(FLT_EPSILON));
    for (int j = 0; j < k; ++j) {
      const double p = out.position[t * k + j] >= 0 ? out.probs[t * E + out.expert[t * k + j]] : 0.0;
      out.weight[t * k + j] = static_cast<float>(k == 1 ? p : p / denom);
    }
  }
  // aux = E * sum_e me_e * ce_e.
  double aux = 0.0;
  for (int e = 0; e < E; ++e) {
    double me = 0.0, ce = 0.0;
    for (int t = 0; t < T; ++t) {
      me += out.probs[t * E + e];
      ce += mask[0][t * E + e];
    }
    out.top1_count[e] = static_cast<int>(ce);
    if (T > 0) aux += (me / T) * (ce / T);
  }
  out.aux_loss = aux * E;
}

}  // namespace tedsim::kernels
