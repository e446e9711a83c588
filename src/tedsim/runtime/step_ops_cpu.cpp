// StepOps on the CPU: host memory, Eigen GEMMs and the CPU kernels, plus the host loops of the
// step's layouts, embedding and cross-entropy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/activations.hpp"
#include "tedsim/kernels/cpu/attention.hpp"
#include "tedsim/kernels/cpu/bf16.hpp"
#include "tedsim/kernels/cpu/cross_entropy.hpp"
#include "tedsim/kernels/cpu/dispatch.hpp"
#include "tedsim/kernels/cpu/layernorm.hpp"
#include "tedsim/kernels/cpu/rmsnorm.hpp"
#include "tedsim/kernels/cpu/rotary.hpp"
#include "tedsim/runtime/step_ops.hpp"
#include "tedsim/runtime/weight_copies.hpp"

namespace tedsim::runtime {
namespace {

struct CpuRouting final : Routing {
  kernels::GatingOutput gate;    // DeepSpeed's fused gating
  kernels::RouterOutput router;  // or one of today's routers
  bool generic = false;
};
const kernels::GatingOutput& gate_of(const Routing& r) {
  const auto& c = static_cast<const CpuRouting&>(r);
  return c.generic ? c.router.gate : c.gate;
}

// rows x cols of src (leading dimension ld) rounded to bf16 into dst, packed (leading dimension cols).
void round_rows_to_bf16(int rows, int cols, const float* src, int ld, float* dst) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      dst[static_cast<std::size_t>(r) * cols + c] = kernels::round_to_bf16(src[static_cast<std::size_t>(r) * ld + c]);
}
void round_rows_to_bf16(int rows, int cols, const float* src, int ld, std::vector<float>& dst) {
  dst.resize(static_cast<std::size_t>(std::max(rows, 0)) * std::max(cols, 0));
  round_rows_to_bf16(rows, cols, src, ld, dst.data());
}

void add_rows(std::size_t n, const float* a, float* y) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) y[i] += a[i];
}

class CpuStepOps final : public StepOps {
 public:
  explicit CpuStepOps(GemmRounding rounding)
      : bf16_gemm_operands_(rounding.bf16_operands), weight_copies_(rounding.weight_copies) {}
  Backend backend() const override { return Backend::cpu; }
  MemorySpace& memory() override { return host_memory(); }
  void fence() override {}

  void copy(float* dst, const float* src, std::size_t n) override {
    if (n && dst != src) std::memmove(dst, src, n * sizeof(float));
  }
  void copy_rows(float* dst, std::size_t dst_stride, const float* src, std::size_t src_stride, std::size_t row_len,
                 std::size_t rows) override {
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, row_len * sizeof(float));
  }
  void to_host(const float* src, float* host_dst, std::size_t n) override { copy(host_dst, src, n); }
  void from_host(const float* host_src, float* dst, std::size_t n) override { copy(dst, host_src, n); }

  void gemm(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
            int ldc) override {
    if (!bf16_gemm_operands_) {
      kernels::gemm(op, m, n, k, a, lda, b, ldb, c, ldc);
      return;
    }
    // The CUDA step's rounding (cuda::gemm_bf16_compute): operands to bf16, products summed in fp32.
    const int b_rows = op.trans_b ? n : k, b_cols = op.trans_b ? k : n;
    round_rows_to_bf16(b_rows, b_cols, b, ldb, b16_);
    multiply_rounding_a(op, m, n, k, a, lda, b16_.data(), c, ldc);
  }
  void gemm_weight(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* w, int ldw,
                   float* c, int ldc) override {
    const int w_rows = op.trans_b ? n : k, w_cols = op.trans_b ? k : n;
    if (!bf16_gemm_operands_ || !weight_copies_ || w_rows <= 0 || w_cols <= 0 || m <= 0) {
      gemm(op, m, n, k, a, lda, w, ldw, c, ldc);
      return;
    }
    bool stale = false;
    auto* w16 = static_cast<float*>(copies_.find(w, w_rows, w_cols, ldw, stale));
    if (stale) round_rows_to_bf16(w_rows, w_cols, w, ldw, w16);
    multiply_rounding_a(op, m, n, k, a, lda, w16, c, ldc);
  }
  void parameters_changed() override { copies_.invalidate(); }
  void add_into(std::size_t n, const float* a, float* y) override { add_rows(n, a, y); }
  void layernorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, const float* beta,
                         float* y, float* mean, float* rstd) override {
    kernels::layernorm_forward(rows, hidden, eps, x, gamma, beta, y, mean, rstd);
  }
  void rmsnorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, float* y,
                       float* rstd) override {
    kernels::rmsnorm_forward(rows, hidden, eps, x, gamma, y, rstd);
  }
  void rmsnorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* rstd, const float* grad_y,
                        float* grad_x, float* grad_gamma) override {
    kernels::rmsnorm_backward(rows, hidden, x, gamma, rstd, grad_y, grad_x, grad_gamma);
  }
  void rotary_forward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                      const float* sin, float* x) override {
    kernels::rotary_forward(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, x);
  }
  void rotary_backward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                       const float* sin, float* grad) override {
    kernels::rotary_backward(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, grad);
  }
  void layernorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* mean,
                          const float* rstd, const float* grad_y, float* grad_x, float* grad_gamma,
                          float* grad_beta) override {
    kernels::layernorm_backward(rows, hidden, x, gamma, mean, rstd, grad_y, grad_x, grad_gamma, grad_beta);
  }
  void gelu_forward(std::size_t n, const float* x, float* y) override { kernels::gelu_forward(n, x, y); }
  void gelu_backward(std::size_t n, const float* x, const float* grad_y, float* grad_x) override {
    kernels::gelu_backward(n, x, grad_y, grad_x);
  }
  void swiglu_forward(int rows, int ffn, const float* x, float* y) override { kernels::swiglu_forward(rows, ffn, x, y); }
  void swiglu_backward(int rows, int ffn, const float* x, const float* grad_y, float* grad_x) override {
    kernels::swiglu_backward(rows, ffn, x, grad_y, grad_x);
  }
  void attention_forward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k, const float* v,
                         float* probs, float* out) override {
    kernels::attention_forward(heads, seq, head_dim, v_dim, true, q, k, v, probs, out);
  }
  void attention_backward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k, const float* v,
                          const float* probs, const float* grad_out, float* grad_q, float* grad_k,
                          float* grad_v) override {
    kernels::attention_backward(heads, seq, head_dim, v_dim, q, k, v, probs, grad_out, grad_q, grad_k, grad_v);
  }
  void adam_step(std::size_t n, const kernels::AdamConfig& cfg, int step, float* params, const float* grads,
                 float* exp_avg, float* exp_avg_sq) override {
    kernels::adam_step(n, cfg, step, params, grads, exp_avg, exp_avg_sq);
  }

  // qkv [b*s, q_l + 2*kvd_l] (columns: the heads' queries, then keys, then values) ->
  // q, k, v [b*heads, s, hd]; query head hi reads kv head hi / (heads / kv_heads).
  void split_heads(const HeadShape& sh, const float* qkv, float* q, float* kx, float* vx) override {
    const int hd = sh.head_dim, grp = sh.heads / sh.kv_heads, q_l = sh.heads * hd, kvd_l = sh.kv_heads * hd;
    const int qkv_l = q_l + 2 * kvd_l;
    for (int bi = 0; bi < sh.b; ++bi)
      for (int p = 0; p < sh.s; ++p) {
        const float* row = qkv + static_cast<std::size_t>(bi * sh.s + p) * qkv_l;
        for (int hi = 0; hi < sh.heads; ++hi) {
          const std::size_t o = (static_cast<std::size_t>(bi * sh.heads + hi) * sh.s + p) * hd;
          const int j = hi / grp;
          std::memcpy(q + o, row + hi * hd, sizeof(float) * hd);
          std::memcpy(kx + o, row + q_l + j * hd, sizeof(float) * hd);
          std::memcpy(vx + o, row + q_l + kvd_l + j * hd, sizeof(float) * hd);
        }
      }
  }
  void merge_heads_grad(const HeadShape& sh, const float* gq, const float* gk, const float* gv,
                        float* gqkv) override {
    const int hd = sh.head_dim, grp = sh.heads / sh.kv_heads, q_l = sh.heads * hd, kvd_l = sh.kv_heads * hd;
    const int qkv_l = q_l + 2 * kvd_l;
    std::memset(gqkv, 0, sizeof(float) * sh.b * sh.s * qkv_l);
    for (int bi = 0; bi < sh.b; ++bi)
      for (int p = 0; p < sh.s; ++p) {
        float* row = gqkv + static_cast<std::size_t>(bi * sh.s + p) * qkv_l;
        for (int hi = 0; hi < sh.heads; ++hi) {
          const std::size_t o = (static_cast<std::size_t>(bi * sh.heads + hi) * sh.s + p) * hd;
          const int j = hi / grp;
          std::memcpy(row + hi * hd, gq + o, sizeof(float) * hd);
          add_rows(hd, gk + o, row + q_l + j * hd);
          add_rows(hd, gv + o, row + q_l + kvd_l + j * hd);
        }
      }
  }
  // [b*heads, s, hd] <-> [b*s, heads*hd].
  void heads_to_tokens(const HeadShape& sh, const float* src, float* dst) override { permute_heads(sh, src, dst, true); }
  void tokens_to_heads(const HeadShape& sh, const float* src, float* dst) override { permute_heads(sh, src, dst, false); }

  std::unique_ptr<Routing> make_routing() override { return std::make_unique<CpuRouting>(); }
  void gating_forward(const float* logits, int tokens, int experts, const kernels::GatingConfig& cfg,
                      Routing& out) override {
    auto& r = static_cast<CpuRouting&>(out);
    r.generic = false;
    kernels::gating_forward(logits, tokens, experts, cfg, r.gate);
  }
  void route_forward(const float* logits, int tokens, int experts, const kernels::RouterConfig& cfg,
                     Routing& out) override {
    auto& r = static_cast<CpuRouting&>(out);
    r.generic = true;
    kernels::route_forward(logits, nullptr, tokens, experts, cfg, r.router);
  }
  void routing_counts(const Routing& r, std::vector<std::int32_t>& kept) override { kept = gate_of(r).kept; }
  int routing_capacity(const Routing& r) override { return gate_of(r).capacity; }
  double aux_loss(const Routing& r) override { return gate_of(r).aux_loss; }
  void aux_statistics(const Routing& r, float* host_stats) override { kernels::aux_statistics(gate_of(r), host_stats); }
  void set_group_aux(Routing& r, const float* host_group_stats, int group_tokens) override {
    auto& c = static_cast<CpuRouting&>(r);
    kernels::set_group_aux(c.generic ? c.router.gate : c.gate, host_group_stats, group_tokens);
  }
  void routing_choices(const Routing& r, std::vector<std::int32_t>& expert,
                       std::vector<std::int32_t>& position) override {
    expert = gate_of(r).expert;
    position = gate_of(r).position;
  }
  void dispatch(const Routing& r, const float* x, int hidden, float* buf) override {
    kernels::dispatch(gate_of(r), x, hidden, buf);
  }
  void combine(const Routing& r, const float* buf, int hidden, float* out) override {
    kernels::combine(gate_of(r), buf, hidden, out);
  }
  void dispatch_backward(const Routing& r, const float* grad_buf, int hidden, float* grad_x) override {
    kernels::dispatch_backward(gate_of(r), grad_buf, hidden, grad_x);
  }
  void combine_backward(const Routing& r, const float* buf, const float* grad_out, int hidden, float* grad_buf,
                        float* grad_weight) override {
    kernels::combine_backward(gate_of(r), buf, grad_out, hidden, grad_buf, grad_weight);
  }
  void gating_backward(const Routing& r, const float* grad_weight, float grad_aux, float* grad_logits) override {
    const auto& c = static_cast<const CpuRouting&>(r);
    if (c.generic)
      kernels::route_backward(c.router, grad_weight, grad_aux, grad_logits);
    else
      kernels::gating_backward(c.gate, grad_weight, grad_aux, grad_logits);
  }

  void embedding_forward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* table,
                         float* out) override {
    const std::size_t h = hidden;
    for (int i = 0; i < tokens; ++i) {
      const int id = ids[i] - v0;
      if (id >= 0 && id < v_local)
        std::memcpy(out + i * h, table + static_cast<std::size_t>(id) * h, sizeof(float) * h);
      else
        std::memset(out + i * h, 0, sizeof(float) * h);
    }
  }
  void embedding_backward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* grad_out,
                          float* table_grad) override {
    const std::size_t h = hidden;
    for (int i = 0; i < tokens; ++i) {
      const int id = ids[i] - v0;
      if (id >= 0 && id < v_local) add_rows(h, grad_out + i * h, table_grad + static_cast<std::size_t>(id) * h);
    }
  }
  void ce_max_and_target(int tokens, int v_local, int v0, const float* logits, const std::int32_t* targets,
                         float* row_max, float* target_logit) override {
    kernels::ce_max_and_target(tokens, v_local, v0, logits, targets, row_max, target_logit);
  }
  void ce_exp_and_sum(int tokens, int v_local, const float* row_max, float* logits, float* row_sum) override {
    kernels::ce_exp_and_sum(tokens, v_local, row_max, logits, row_sum);
  }
  void ce_gradient(int tokens, int v_local, int v0, const std::int32_t* targets, const float* row_sum, float scale,
                   float* logits) override {
    kernels::ce_gradient(tokens, v_local, v0, targets, row_sum, scale, logits);
  }

 private:
  static void permute_heads(const HeadShape& sh, const float* src, float* dst, bool to_tokens) {
    const int hd = sh.head_dim, q_l = sh.heads * hd;
    for (int bi = 0; bi < sh.b; ++bi)
      for (int hi = 0; hi < sh.heads; ++hi)
        for (int p = 0; p < sh.s; ++p) {
          const std::size_t tok = static_cast<std::size_t>(bi * sh.s + p) * q_l + hi * hd;
          const std::size_t head = (static_cast<std::size_t>(bi * sh.heads + hi) * sh.s + p) * hd;
          if (to_tokens)
            std::memcpy(dst + tok, src + head, sizeof(float) * hd);
          else
            std::memcpy(dst + head, src + tok, sizeof(float) * hd);
        }
  }

  // C = op(A) op(B16) with A rounded to bf16 here; B16 packed (leading dimension its column count).
  void multiply_rounding_a(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b16,
                           float* c, int ldc) {
    const int a_rows = op.trans_a ? k : m, a_cols = op.trans_a ? m : k;
    round_rows_to_bf16(a_rows, a_cols, a, lda, a16_);
    kernels::gemm(op, m, n, k, a16_.data(), std::max(a_cols, 1), b16, std::max(op.trans_b ? k : n, 1), c, ldc);
  }

  bool bf16_gemm_operands_;
  bool weight_copies_;
  std::vector<float> a16_, b16_;  // the rounded operands
  WeightCopies copies_{host_memory(), sizeof(float)};  // bf16 values, held as floats
};

}  // namespace

std::unique_ptr<StepOps> make_cpu_step_ops(GemmRounding rounding) {
  return std::make_unique<CpuStepOps>(rounding);
}

}  // namespace tedsim::runtime
