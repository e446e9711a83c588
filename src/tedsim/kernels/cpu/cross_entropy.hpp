#pragma once
// Vocabulary-parallel cross-entropy, CPU fp32: the three passes of the step's loss over this
// rank's logits [tokens, v_local] (vocabulary rows [v0, v0 + v_local)). Between them the caller
// all-reduces the row max and the exp sum over the tensor group. The CUDA kernels of
// kernels/cuda/loss.cu compute the same passes; calibration times these to price the loss.
#include <cstdint>

namespace tedsim::kernels {

// row_max[t] = max of row t; target_logit[t] = row t's entry at targets[t], 0 where another rank
// owns that id.
void ce_max_and_target(int tokens, int v_local, int v0, const float* logits, const std::int32_t* targets,
                       float* row_max, float* target_logit);

// Row t becomes exp(logit - row_max[t]) (vectorized exp); row_sum[t] = its sum, added in double
// (vocabulary rows are long).
void ce_exp_and_sum(int tokens, int v_local, const float* row_max, float* logits, float* row_sum);

// The logits' gradient in place: exp / row_sum * scale, minus scale at the target.
void ce_gradient(int tokens, int v_local, int v0, const std::int32_t* targets, const float* row_sum, float scale,
                 float* logits);

}  // namespace tedsim::kernels
