#pragma once
// The model's norm over a layer's token rows (this rank's Tl under sequence parallelism):
// LayerNorm with a gain and a bias, or RMSNorm with a gain only.
#include <string>

#include "tedsim/runtime/param_registrar.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

struct NormActs {
  Tensor mean, rstd;  // per row (RMSNorm keeps rstd only)
};

class NormLayer {
 public:
  // The gain as global tensor `tensor_id` and, for LayerNorm, the bias as `tensor_id + 1`;
  // `noise` > 0 randomizes both (gradient checks).
  void register_params(ParamRegistrar& reg, const ModelSpec& model, const std::string& name, const std::string& kind,
                       int tensor_id, int hidden, float noise);
  // Over the layer's token rows of `hidden` (the decoder's norms).
  void forward(StepContext& c, const float* x, float* y, NormActs& a);
  // gx = d(loss)/dx for gy = d(loss)/dy; the gain's (and bias's) gradients accumulate.
  void backward(StepContext& c, const float* x, const NormActs& a, const float* gy, float* gx);
  // Over `rows` rows of `width` (MLA's latent norms, on every token of the micro-batch).
  void forward(StepContext& c, int rows, int width, const float* x, float* y, NormActs& a);
  void backward(StepContext& c, int rows, int width, const float* x, const NormActs& a, const float* gy, float* gx);

 private:
  int gamma_ = -1, beta_ = -1;
};

}  // namespace tedsim::runtime
