#pragma once
// The vocabulary-parallel token embedding (Megatron's VocabParallelEmbedding): this rank holds
// vocabulary rows [vocab_first, vocab_first + vocab_local) and looks up the tokens that fall there;
// the partial rows are all-reduced over the tensor group (reduce-scattered into this rank's token
// rows under sequence parallelism).
#include <cstdint>

#include "tedsim/runtime/param_registrar.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

// This rank's vocabulary rows of a [vocab, h] table (the embedding, its copies, the LM head).
Slice vocab_rows(const StepDims& d);
// A copy on this stage of the embedding another stage owns (counted there), initialized alike.
int add_embedding_copy(ParamRegistrar& reg, const StepContext& c, float stdv);

class Embedding {
 public:
  // Global tensor 1, in ZeRO-3 unit 0.
  void register_params(ParamRegistrar& reg, const StepContext& c, float stdv);
  // tokens: host ids of the micro-batch's T tokens; x: the first layer's input [Tl, h].
  void forward(StepContext& c, const std::int32_t* tokens, float* x);
  // g: d(loss)/dx [Tl, h]; the table's gradient accumulates.
  void backward(StepContext& c, const std::int32_t* tokens, const float* g);
  // A last stage's lookup for multi-token prediction: the table this stage already holds (the
  // embedding itself on a one-stage step, a tied embedding's copy), or a copy of its own in the
  // head's ZeRO-3 unit L + 1, initialized alike and kept equal by the Trainer's embedding sync.
  void share(int table) { table_ = table; }
  void register_copy(ParamRegistrar& reg, const StepContext& c, float stdv);
  int table() const { return table_; }

 private:
  int table_ = -1;
};

}  // namespace tedsim::runtime
