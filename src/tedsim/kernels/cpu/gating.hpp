#pragma once
// MoE gating (router) with DeepSpeed's top-k semantics, CPU fp32.
//
// Semantics (checked by tests against gating_forward_reference):
// - probs = softmax over the E experts of each token's logits.
// - Top-k choices are selected on the logits (softmax is monotone, and selecting before exp avoids
//   ties that rounding in exp could create); ties go to the lowest expert index. No gumbel noise
//   (DeepSpeed's top2 adds it to the 2nd choice in training; we keep routing deterministic).
// - capacity C = max(ceil(k*f*T/E), min_capacity).
// - Positions inside each expert's buffer are assigned in token order, all j-th choices of all
//   tokens before any (j+1)-th choice; a choice whose position is >= C is dropped (position -1).
// - Combine weights: k == 1: the softmax probability of the kept choice (DeepSpeed top1gating).
//   k >= 2: probabilities of the token's kept choices renormalized to sum 1 over the kept choices
//   (DeepSpeed top2gating/topkgating: denominator clamped at FLT_EPSILON); dropped choices weigh 0.
// - aux_loss = E * sum_e(mean_t probs[t,e] * fraction of tokens whose top-1 choice is e), the top-1
//   fraction counted before capacity dropping (as DeepSpeed's mask1).
#include <cstdint>
#include <vector>

namespace tedsim::kernels {

inline constexpr int kMaxTopK = 8;

struct GatingConfig {
  int k = 1;                     // choices per token, 1..kMaxTopK and <= experts
  double capacity_factor = 1.0;  // f
  int min_capacity = 4;          // c_min
  bool drop_tokens = true;       // false: capacity is the worst case (k*T), nothing is dropped
};

// C = max(ceil(k*f*T/E), min_capacity). Throws InputError on non-positive experts/k or negative f.
int capacity(std::int64_t tokens, int experts, int k, double factor, int min_capacity);

struct GatingOutput {
  int tokens = 0, experts = 0, k = 0, capacity = 0;
  std::vector<float> probs;             // [T,E] softmax, kept for the backward pass
  std::vector<std::int32_t> expert;     // [T,k] chosen expert of each choice (also if dropped)
  std::vector<std::int32_t> position;   // [T,k] slot in the expert's [C,h] buffer, -1 if dropped
  std::vector<float> weight;            // [T,k] combine weight, 0 if dropped
  std::vector<std::int32_t> routed;     // [E] choices routed to e before dropping
  std::vector<std::int32_t> kept;       // [E] choices kept by e (<= C): the expert token counts
  std::vector<std::int32_t> top1_count; // [E] tokens whose top-1 choice is e (for the aux loss)
  double aux_loss = 0.0;
  // The aux loss's token count: 0 means `tokens`. Under sequence parallelism the tensor group's
  // ranks each route their own tokens and the loss is the group's (set_group_aux).
  int aux_tokens = 0;
};

// Sequence parallelism (Megatron-Core all-reduces the router's statistics over the tensor group):
// this routing's per-expert statistics, [2E] = top-1 counts then probability sums over its tokens;
// summed over the group they give, through set_group_aux, the aux loss of all the group's tokens
// and each token's share of its gradient, so the step equals the unsplit one.
void aux_statistics(const GatingOutput& out, float* stats);
void set_group_aux(GatingOutput& out, const float* group_stats, int group_tokens);

// Fused kernel: one pass over the logits (softmax + top-k + aux statistics), one pass over the
// [T,k] choices (positions, weights). Reuses `out`'s storage when shapes repeat.
void gating_forward(const float* logits, int tokens, int experts, const GatingConfig& cfg,
                    GatingOutput& out);

// Plain reference (fp64 softmax, straightforward loops) used by tests to check gating_forward.
void gating_forward_reference(const float* logits, int tokens, int experts,
                              const GatingConfig& cfg, GatingOutput& out);

// Backward of gating: grad_logits[T,E] from d(loss)/d(weight)[T,k] and d(loss)/d(aux_loss).
// Routing (choices, positions, drops) is piecewise constant and contributes no gradient; the
// top-1 fractions in the aux loss are treated as constants, as in DeepSpeed.
void gating_backward(const GatingOutput& fwd, const float* grad_weight, float grad_aux,
                     float* grad_logits);

}  // namespace tedsim::kernels
