#pragma once
// The compute primitives of the training step on one backend. The step's modules (layers/, moe/,
// pipeline/, optimizer/) hold their tensors in the backend's memory space and do all arithmetic
// and data movement through these calls, so one piece of step code runs on the CPU (host memory, Eigen GEMMs, the CPU
// kernels) and on a GPU (device memory, cuBLAS, the CUDA kernels). Collectives go through the
// Communicator, whose backend (MPI on host memory, NCCL on device memory) matches.
//
// Pointers are in the backend's memory unless a parameter says host. Work may be queued
// (CUDA): fence() waits for it, and every timer of the step reads its clock after a fence.
#include <cstdint>
#include <memory>
#include <vector>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/kernels/cpu/adam.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/router.hpp"
#include "tedsim/kernels/cpu/gemm.hpp"
#include "tedsim/runtime/tensor.hpp"

namespace tedsim::runtime {

// The gating output of one MoE layer in the backend's memory (routing decisions, weights, probs),
// kept from the forward pass for dispatch, combine and the backward pass.
class Routing {
 public:
  virtual ~Routing() = default;
};

// Dimensions of the attention head layouts: b sequences of s tokens, `heads` query heads and
// `kv_heads` key/value heads of head_dim each on this rank.
struct HeadShape {
  int b = 1, s = 1, heads = 1, kv_heads = 1, head_dim = 1;
};

class StepOps {
 public:
  virtual ~StepOps() = default;
  virtual Backend backend() const = 0;
  virtual MemorySpace& memory() = 0;
  virtual void fence() = 0;  // waits for every queued operation

  // Data movement (counts in floats).
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;
  // rows x row_len floats between strided rows.
  virtual void copy_rows(float* dst, std::size_t dst_stride, const float* src, std::size_t src_stride,
                         std::size_t row_len, std::size_t rows) = 0;
  virtual void to_host(const float* src, float* host_dst, std::size_t n) = 0;
  virtual void from_host(const float* host_src, float* dst, std::size_t n) = 0;

  // Arithmetic.
  virtual void gemm(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                    float* c, int ldc) = 0;
  // gemm() whose B operand is a weight (or a block of one) that stays unchanged until the next
  // parameters_changed(). Backends that round GEMM operands to bf16 round it once per step
  // (weight_copies.hpp) rather than on every call; the others just multiply.
  virtual void gemm_weight(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* w,
                           int ldw, float* c, int ldc) {
    gemm(op, m, n, k, a, lda, w, ldw, c, ldc);
  }
  // Parameters may have changed since the last call: gemm_weight's copies go stale.
  virtual void parameters_changed() {}
  virtual void add_into(std::size_t n, const float* a, float* y) = 0;  // y += a
  virtual void layernorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma,
                                 const float* beta, float* y, float* mean, float* rstd) = 0;
  virtual void layernorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* mean,
                                  const float* rstd, const float* grad_y, float* grad_x, float* grad_gamma,
                                  float* grad_beta) = 0;
  // RMSNorm (kernels/cpu/rmsnorm.hpp; kernels/cuda/rmsnorm.cu on the device).
  virtual void rmsnorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, float* y,
                               float* rstd) = 0;
  virtual void rmsnorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* rstd,
                                const float* grad_y, float* grad_x, float* grad_gamma) = 0;
  // Rotary position embeddings (kernels/cpu/rotary.hpp), in place on token rows; cos and sin are
  // kernels::rotary_table's, in this backend's memory.
  virtual void rotary_forward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride,
                              const float* cos, const float* sin, float* x) = 0;
  virtual void rotary_backward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride,
                               const float* cos, const float* sin, float* grad) = 0;
  virtual void gelu_forward(std::size_t n, const float* x, float* y) = 0;
  virtual void gelu_backward(std::size_t n, const float* x, const float* grad_y, float* grad_x) = 0;
  virtual void swiglu_forward(int rows, int ffn, const float* x, float* y) = 0;
  virtual void swiglu_backward(int rows, int ffn, const float* x, const float* grad_y, float* grad_x) = 0;
  // Causal; q and k of head_dim, v and the output of v_dim (MLA's value heads differ).
  virtual void attention_forward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k,
                                 const float* v, float* probs, float* out) = 0;
  virtual void attention_backward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k,
                                  const float* v, const float* probs, const float* grad_out, float* grad_q,
                                  float* grad_k, float* grad_v) = 0;
  virtual void adam_step(std::size_t n, const kernels::AdamConfig& cfg, int step, float* params, const float* grads,
                         float* exp_avg, float* exp_avg_sq) = 0;

  // Attention head layouts (runtime/step_ops_cpu.cpp documents them).
  virtual void split_heads(const HeadShape& s, const float* qkv, float* q, float* k, float* v) = 0;
  virtual void merge_heads_grad(const HeadShape& s, const float* grad_q, const float* grad_k, const float* grad_v,
                                float* grad_qkv) = 0;
  virtual void heads_to_tokens(const HeadShape& s, const float* src, float* dst) = 0;
  virtual void tokens_to_heads(const HeadShape& s, const float* src, float* dst) = 0;

  // MoE routing (kernels/cpu/gating.hpp and dispatch.hpp semantics).
  virtual std::unique_ptr<Routing> make_routing() = 0;
  virtual void gating_forward(const float* logits, int tokens, int experts, const kernels::GatingConfig& cfg,
                              Routing& out) = 0;
  virtual double aux_loss(const Routing& r) = 0;
  // Host copies of the [T,k] chosen experts and positions (routing signatures).
  virtual void routing_choices(const Routing& r, std::vector<std::int32_t>& expert,
                               std::vector<std::int32_t>& position) = 0;
  virtual void dispatch(const Routing& r, const float* x, int hidden, float* buf) = 0;
  virtual void combine(const Routing& r, const float* buf, int hidden, float* out) = 0;
  virtual void dispatch_backward(const Routing& r, const float* grad_buf, int hidden, float* grad_x) = 0;
  virtual void combine_backward(const Routing& r, const float* buf, const float* grad_out, int hidden,
                                float* grad_buf, float* grad_weight) = 0;
  virtual void gating_backward(const Routing& r, const float* grad_weight, float grad_aux, float* grad_logits) = 0;
  // The routers of kernels/cpu/router.hpp (today's models; dropless with cfg.drop_tokens false;
  // kernels/cuda/router.cu on the device). gating_backward then runs their backward.
  virtual void route_forward(const float* logits, int tokens, int experts, const kernels::RouterConfig& cfg,
                             Routing& out) = 0;
  // Sequence parallelism: the routing's aux-loss statistics as [2E] host floats, and the aux loss
  // of the tensor group's tokens from their sums (kernels/cpu/gating.hpp). CPU step only yet:
  // the CUDA ops throw RunError.
  virtual void aux_statistics(const Routing& r, float* host_stats) = 0;
  virtual void set_group_aux(Routing& r, const float* host_group_stats, int group_tokens) = 0;
  // Host copy of the choices each expert kept (its rows in the dispatch buffer), [E].
  virtual void routing_counts(const Routing& r, std::vector<std::int32_t>& kept) = 0;
  // The dispatch buffer's capacity C of this routing (dropless: the busiest expert's count).
  virtual int routing_capacity(const Routing& r) = 0;

  // Token embedding and vocabulary-parallel cross-entropy; ids and targets are host arrays of
  // global token ids, this rank owning vocabulary rows [v0, v0 + v_local).
  virtual void embedding_forward(int tokens, int hidden, int v0, int v_local, const std::int32_t* host_ids,
                                 const float* table, float* out) = 0;
  virtual void embedding_backward(int tokens, int hidden, int v0, int v_local, const std::int32_t* host_ids,
                                  const float* grad_out, float* table_grad) = 0;
  virtual void ce_max_and_target(int tokens, int v_local, int v0, const float* logits,
                                 const std::int32_t* host_targets, float* row_max, float* target_logit) = 0;
  virtual void ce_exp_and_sum(int tokens, int v_local, const float* row_max, float* logits, float* row_sum) = 0;
  virtual void ce_gradient(int tokens, int v_local, int v0, const std::int32_t* host_targets, const float* row_sum,
                           float scale, float* logits) = 0;
};

// How a backend rounds GEMM operands. bf16_operands: round every GEMM's operands to bf16 first, as
// the CUDA step always does (on the CPU: so that the two steps can be compared beyond that
// rounding). weight_copies: round gemm_weight's weights once per step, not once per call; the
// products are the same bits either way (tests/runtime/test_weight_copies.cpp).
struct GemmRounding {
  bool bf16_operands = false;
  bool weight_copies = true;
};

// CPU: host memory, Eigen, the CPU kernels.
std::unique_ptr<StepOps> make_cpu_step_ops(GemmRounding rounding = {});
// Throws RunError when `backend` cannot run here (cuda: a build without CUDA, or no usable device).
// Touches no device, so it is safe before each rank has selected its own.
void require_step_ops(Backend backend);
// The ops for `backend` (on the current device for cuda); throws as require_step_ops does.
// rounding.bf16_operands applies to the CPU ops (the CUDA ops always round GEMM operands to bf16).
std::unique_ptr<StepOps> make_step_ops(Backend backend, GemmRounding rounding = {});

}  // namespace tedsim::runtime
