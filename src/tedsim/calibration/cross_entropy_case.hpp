#pragma once
// The loss's calibration point, shared by the CPU and CUDA benches: logits of the model's
// vocabulary width (one tensor rank's slice is as wide or narrower: the rate per byte is the same
// on rows this long), targets, and the gradient the three passes must leave, in double.
#include <cstdint>
#include <vector>

#include "tedsim/spec/model_spec.hpp"

namespace tedsim::calibration {

struct CrossEntropyCase {
  int rows = 1, cols = 1;           // tokens, vocabulary
  std::vector<float> logits;        // rows x cols
  std::vector<std::int32_t> targets;
  float scale = 1.0f;               // the step's weight of one token's loss
  double bytes() const { return 20.0 * rows * cols; }  // the workload's fp32 passes: 12 forward, 8 backward
  // The logits' gradient after ce_max_and_target, ce_exp_and_sum and ce_gradient on `logits`.
  std::vector<float> reference_gradient() const;
};

// A case of about `bytes` (as the workload counts the loss's bytes) for `model`'s vocabulary.
CrossEntropyCase make_cross_entropy_case(double bytes, const ModelSpec& model);

}  // namespace tedsim::calibration
