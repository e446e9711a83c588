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

  // The parts of forward(), for a stage that runs multi-token prediction between them (mtp.hpp):
  // the final norm of x into normed() [Tl, h]; the shared output layer and cross-entropy on
  // normed hidden states `hidden` [Tl, h] (the main model's or a prediction module's), where the
  // last `masked_tail` positions of each sequence have no target and count for nothing. It returns
  // the mean cross-entropy over the counted tokens and, with `grad_hidden`, writes d(loss)/d(hidden)
  // there for the loss weighted `weight` per counted token, accumulating the weight's gradient;
  // then the final norm's backward of d(loss)/d(normed) into `grad`.
  const float* norm_forward(StepContext& c, const float* x);
  const float* normed() const { return normed_.data(); }
  double output_loss(StepContext& c, const float* hidden, const std::int32_t* targets, int masked_tail, float weight,
                     float* grad_hidden);
  void norm_backward(StepContext& c, const float* x, const float* grad_normed, Tensor& grad);
  // The main loss's weight per token: 1 / (tokens x global micro-batches).
  static float token_weight(const StepDims& d) {
    return 1.0f / (static_cast<float>(d.tokens) * static_cast<float>(d.global_micro_batches));
  }

  int weight() const { return weight_; }

 private:
  NormLayer final_norm_;
  int weight_ = -1;
  Tensor normed_, normed_full_, logits_, row_stats_;
  NormActs norm_acts_;
  std::vector<float> host_stats_;
  std::vector<std::int32_t> counted_targets_;  // masked positions' targets replaced by 0
  Tensor grad_normed_;
};

}  // namespace tedsim::runtime
