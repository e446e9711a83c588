#pragma once
// A multi-token-prediction module (DeepSeek-V3 section 2.2; Megatron-Core's
// MultiTokenPredictionLayer at 2edffadb), on the last stage after the main model's final norm.
// Module k (k = 0..D-1) predicts each position's token k + 2 ahead: the embedding of the token
// k + 1 ahead and the previous depth's hidden state (module 0: the main model's normed output),
// each normed (enorm, hnorm), concatenated [embedding, hidden] and projected 2h -> h by eh_proj,
// a column-parallel linear whose output slices are gathered back to whole rows (Megatron's
// gather_from_tensor_model_parallel_region; under sequence parallelism each rank then keeps its
// own rows); then one transformer layer of the last model layer's kind and the module's own final
// norm. Its output feeds the shared output layer (LmHead::output_loss) and the next module.
#include <cstdint>
#include <vector>

#include "tedsim/runtime/layers/embedding.hpp"
#include "tedsim/runtime/layers/transformer_layer.hpp"

namespace tedsim::runtime {

struct MtpActs {
  std::vector<std::int32_t> tokens, targets;  // host: the micro-batch's shifted by depth + 1 (0 past the end)
  Tensor emb, en, hn, cat, cat_full;           // the embedding, the two norms' outputs, [en, hn] and its gathered rows
  Tensor proj_local, proj_gathered, proj;      // eh_proj's output slice, the group's slices, whole rows [T, h]
  Tensor layer_out, out;                       // the layer's output and the module's normed output [Tl, h]
  Tensor grad, xfull;                          // backward: d(loss)/d(layer output), SP's input rows gathered again
  Tensor grad_out, grad_in;                    // the stage's: d(loss)/d(out) and d(loss)/d(the module's hidden input)
  NormActs enorm, hnorm, fnorm;
  LayerActs layer;
  std::vector<Tensor> stash;  // CAC: the layer's collective outputs under full recompute
};

class MtpModule {
 public:
  // Depth `depth` of a model of L layers: its layer's parameters are index L + 1 + depth's
  // (TransformerLayer), its own global tensors 100 (L + 2 + depth) + 80..87, all in ZeRO-3 unit
  // L + 2 + depth.
  MtpModule(const StepContext& c, int depth);
  void register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank, const InitScales& init);
  int unit() const { return unit_; }

  // The micro-batch's tokens and targets [T] shifted for this depth into A; the last depth + 1
  // positions of each sequence have none (LmHead::output_loss's masked tail).
  void shift(const StepDims& d, const std::int32_t* tokens, const std::int32_t* targets, MtpActs& A) const;
  int masked_tail() const { return depth_ + 1; }
  // h: the previous depth's hidden state [Tl, h]; writes A.out. `backward_follows` records the
  // layer's collectives for CAC's replay under full recompute.
  void forward(StepContext& c, Embedding& embedding, const float* h, MtpActs& A, bool backward_follows);
  // g: d(loss)/d(A.out) [Tl, h]; writes d(loss)/dh into grad_h [Tl, h] (=) and
  // accumulates the embedding's and the module's gradients. Under full recompute the layer's
  // forward is replayed first, as the cost model prices it.
  void backward(StepContext& c, Embedding& embedding, const float* h, MtpActs& A, const float* g, float* grad_h);

 private:
  int depth_, unit_, base_;
  NormLayer enorm_, hnorm_, final_norm_;
  int eh_proj_ = -1;  // [h, 2h]: this tensor rank's h / t output rows
  TransformerLayer layer_;
};

}  // namespace tedsim::runtime
