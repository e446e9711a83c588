#pragma once
// What `tedsim model show` tells about a model: its layer kinds, their parameters and their
// forward FLOPs per token, and the totals (active parameters count the routed experts a token is
// sent to, top_k of them, and every other weight).
#include <string>
#include <vector>

#include "tedsim/spec/model_spec.hpp"

namespace tedsim {

struct LayerKindSummary {
  std::string kind;          // "dense", "moe", "moe+shared"; the attention kind is the model's
  int count = 0;             // layers of this kind
  double params = 0;         // per layer
  double active_params = 0;  // per layer, per token
  double forward_flops_per_token = 0;  // per layer: 2 x active weights + the attention core
};

struct ModelSummary {
  std::vector<LayerKindSummary> kinds;
  double embedding_params = 0;        // input embedding + LM head (one matrix when tied)
  double head_forward_flops_per_token = 0;  // LM head
  double total_params = 0, active_params = 0, active_params_without_input_embedding = 0;
  double forward_flops_per_token = 0;  // whole model, at the given sequence length
};

// FLOPs count a GEMM as 2 m n k; the attention core (scores and context) is costed over the full
// sequence as Megatron-LM's FLOPs formula does, not halved for the causal mask.
ModelSummary summarize_model(const ModelSpec& model, int seq_len);

}  // namespace tedsim
