#include "tedsim/runtime/layers/mlp.hpp"

namespace tedsim::runtime {
namespace {
const MlpCollectiveNames kDenseNames{"sp_allgather_mlp", "tp_allreduce_mlp", "sp_reducescatter_mlp",
                                     "sp_allgather_mlp_bwd", "sp_reducescatter_mlp_bwd"};
const MlpCollectiveNames kSharedNames{"sp_allgather_shared", "tp_allreduce_shared", "sp_reducescatter_shared",
                                      "sp_allgather_shared_bwd", "sp_reducescatter_shared_bwd"};
}  // namespace

void TensorParallelMlp::register_params(ParamRegistrar& reg, const StepContext& c, Kind kind,
                                        const std::string& prefix, int tensor_id, float stdv, float out_std) {
  const StepDims& d = c.dims;
  const bool dense = kind == Kind::dense;
  const int width = dense ? c.model.ffn : d.shared_width;
  width_local_ = dense ? d.ffn_local : d.shared_width_local;
  fc1_local_ = dense ? d.ffn_fc1_local : d.shared_fc1_local;
  names_ = dense ? kDenseNames : kSharedNames;
  const int h = d.hidden, ti = d.tensor_rank, wl = width_local_;
  // This rank's columns of fc1 (with SwiGLU, of its gate half and of its up half).
  std::vector<std::pair<int, int>> cols{{ti * wl, (ti + 1) * wl}};
  if (d.swiglu) cols.push_back({width + ti * wl, width + (ti + 1) * wl});
  const int fc1_width = d.swiglu ? 2 * width : width;
  const std::string name = prefix + (dense ? "mlp." : "moe.shared.");
  const std::string kind_name = dense ? "mlp_" : "shared_";
  fc1_ = reg.add(name + "fc1", kind_name + "fc1", tensor_id, false, false,
                 ParamRegistrar::slice(1, h, fc1_width, 0, 1, 0, h, cols), 0, stdv);
  fc2_ = reg.add(name + "fc2", kind_name + "fc2", tensor_id + 1, false, false,
                 ParamRegistrar::slice(1, width, h, 0, 1, ti * wl, (ti + 1) * wl, {{0, h}}), 0, out_std);
}

void TensorParallelMlp::forward(StepContext& c, const float* in, MlpActs& A, float* out) {
  const int T = c.dims.tokens, h = c.dims.hidden;
  const float* x = c.sp_gather(in, c.ws.sp_in, names_.gather);
  c.mm(T, fc1_local_, h, x, c.P(fc1_), ensure(A.fc1_out, static_cast<std::size_t>(T) * fc1_local_));
  c.activation_forward(T, width_local_, A.fc1_out.data(),
                       ensure(A.act_out, static_cast<std::size_t>(T) * width_local_));
  float* y = c.block_output(out);
  c.mm(T, h, width_local_, A.act_out.data(), c.P(fc2_), y);
  c.block_exit(y, out, names_.allreduce, names_.scatter);
}

// Under SP the gradient is gathered first, and the input again for the fc1 weight gradient
// (Megatron-Core keeps only the rank's rows between forward and backward).
void TensorParallelMlp::backward(StepContext& c, const float* in, const MlpActs& A, const float* g, float* gx,
                                 Tensor& act_grad, Tensor& fc1_grad) {
  const int T = c.dims.tokens, h = c.dims.hidden;
  const float* gy = c.sp_gather(g, c.ws.sp_grad, names_.gather_bwd);
  float* ga1 = ensure(act_grad, static_cast<std::size_t>(T) * width_local_);
  c.mm_bt(T, width_local_, h, gy, c.P(fc2_), ga1);
  c.mm_at_acc(width_local_, h, T, A.act_out.data(), gy, c.G(fc2_));
  float* gf1 = ensure(fc1_grad, static_cast<std::size_t>(T) * fc1_local_);
  c.activation_backward(T, width_local_, A.fc1_out.data(), ga1, gf1);
  float* gxp = c.block_output(gx);
  c.mm_bt(T, h, fc1_local_, gf1, c.P(fc1_), gxp);
  const float* x = c.sp_gather(in, c.ws.sp_in, "sp_regather_for_wgrad");
  c.mm_at_acc(h, fc1_local_, T, x, gf1, c.G(fc1_));
  c.block_exit(gxp, gx, names_.allreduce, names_.scatter_bwd);
}

}  // namespace tedsim::runtime
