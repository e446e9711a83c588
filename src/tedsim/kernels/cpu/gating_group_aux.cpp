// The load-balancing loss over a group of ranks that each routed their own tokens (sequence
// parallelism): aux = E * sum_e (P_e / N) * (c_e / N) with P_e, c_e and N summed over the group.
#include "tedsim/kernels/cpu/gating.hpp"

namespace tedsim::kernels {

void aux_statistics(const GatingOutput& out, float* stats) {
  const int T = out.tokens, E = out.experts;
  for (int e = 0; e < E; ++e) {
    stats[e] = static_cast<float>(out.top1_count[e]);
    double sum = 0.0;
    for (int t = 0; t < T; ++t) sum += out.probs[static_cast<std::size_t>(t) * E + e];
    stats[E + e] = static_cast<float>(sum);
  }
}

void set_group_aux(GatingOutput& out, const float* group_stats, int group_tokens) {
  const int E = out.experts;
  double aux = 0.0;
  for (int e = 0; e < E; ++e) {
    // Counts are exact in fp32 below 2^24 tokens; rounded back to integers.
    out.top1_count[e] = static_cast<std::int32_t>(group_stats[e] + 0.5f);
    if (group_tokens > 0)
      aux += (static_cast<double>(group_stats[E + e]) / group_tokens) *
             (static_cast<double>(out.top1_count[e]) / group_tokens);
  }
  out.aux_tokens = group_tokens;
  out.aux_loss = aux * E;
}

}  // namespace tedsim::kernels
