#pragma once
// MoE routers beside DeepSpeed's gating (gating.hpp): the score functions and top-k rules of the
// models trained now, CPU fp32, producing the same GatingOutput that dispatch and combine read.
//
// Semantics (checked by tests against a plain fp64 reference):
// - softmax_topk (Qwen-MoE, OLMoE, DeepSeek-V2): p = softmax over all experts; the top k by p; the
//   weight of a kept choice is p, or with `normalize` p / (sum of the kept choices' p), clamped at
//   FLT_EPSILON as DeepSpeed does; times `scaling`.
// - topk_softmax (Mixtral, gpt-oss): the top k logits; weights = softmax over those k, computed
//   before capacity dropping (Megatron-Core's order), times `scaling`; dropped choices weigh 0.
// - sigmoid (DeepSeek-V3): s = sigmoid(logits); choices by s + expert_bias (the auxiliary-loss-free
//   balancing bias, which never enters a weight); weights s, or with `normalize` s / (sum of the k
//   chosen s, + 1e-20 as DeepSeek writes it), before dropping, times `scaling`.
// - Group-limited routing (groups > 1): experts split into `groups` equal consecutive groups; a
//   group's score is the sum of its top (k / topk_groups) selection scores (Megatron-Core's and
//   DeepSeek-V3's rule); each token chooses only among its best `topk_groups` groups.
// - Ties go to the lowest index, for groups and experts alike (the first maximum in a scan).
// - Capacity and positions as DeepSpeed: C = max(ceil(k f T / E), min_capacity); slots in token
//   order, all j-th choices before any (j+1)-th; a choice at slot >= C is dropped (position -1).
//   Dropless (drop_tokens = false): C is the busiest expert's count, nothing is dropped.
// - aux_loss = E * sum_e mean_t(q[t,e]) * top-1 fraction of e, with q the softmax over all logits
//   (sigmoid: s normalized per token), the fractions treated as constants in backward.
#include <cstdint>
#include <vector>

#include "tedsim/kernels/cpu/gating.hpp"

namespace tedsim::kernels {

enum class RouterKind : std::uint8_t { softmax_topk, topk_softmax, sigmoid };

struct RouterConfig {
  RouterKind kind = RouterKind::softmax_topk;
  int k = 1;
  bool normalize = false;
  float scaling = 1.0f;
  int groups = 1, topk_groups = 1;
  double capacity_factor = 1.0;
  int min_capacity = 4;
  bool drop_tokens = true;  // false: dropless
};

struct RouterOutput {
  RouterConfig cfg;
  GatingOutput gate;                 // choices, positions, weights; gate.probs holds q (the aux loss's)
  std::vector<float> scores;         // [T,E] sigmoid: s; else unused
  std::vector<float> chosen_weight;  // [T,k] the weights before capacity dropping and scaling
};

// expert_bias: [E] for sigmoid routing (may be null: no bias); ignored by the other kinds.
void route_forward(const float* logits, const float* expert_bias, int tokens, int experts, const RouterConfig& cfg,
                   RouterOutput& out);

// grad_logits[T,E] from d(loss)/d(weight)[T,k] and d(loss)/d(aux_loss); the choices are constants.
void route_backward(const RouterOutput& fwd, const float* grad_weight, float grad_aux, float* grad_logits);

}  // namespace tedsim::kernels
