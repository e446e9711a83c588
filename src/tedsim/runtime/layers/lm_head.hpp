#pragma once
// The final norm, the vocabulary-parallel LM head and cross-entropy (Megatron's
// vocab_parallel_cross_entropy): each tensor rank computes the logits of its vocabulary rows, and
// the row maxima and the sums of exponentials are all-reduced over the tensor group. Under
// sequence parallelism the head gathers the final norm's rows first.
#include <cstdint>
#include <vector>

#include "tedsim/runtime/layers/norm.hpp"

namespace tedsim::runtime {

class LmHead {
 public:
  // In ZeRO-3 unit L + 1: the LM head (global tensor 2), or with tied embeddings the embedding
  // itself (`embedding_table` on a one-stage step) or a copy of it (a last stage apart from the
  // first), and the final norm (tensors 3, 4).
  void register_params(ParamRegistrar& reg, const StepContext& c, int embedding_table, float stdv, float norm_noise);
  // x: the last layer's output [Tl, h]. Returns the micro-batch's mean cross-entropy; with
  // `backward`, writes d(loss)/dx into `grad` (the loss scaled by 1 / global micro-batches).
  double forward(StepContext& c, const float* x, const std::int32_t* targets, bool backward, Tensor& grad);
  int weight() const { return weight_; }

 private:
  NormLayer final_norm_;
  int weight_ = -1;
  Tensor normed_, normed_full_, logits_, row_stats_;
  NormActs norm_acts_;
  std::vector<float> host_stats_;
};

}  // namespace tedsim::runtime
