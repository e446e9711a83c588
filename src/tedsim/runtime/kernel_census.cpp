#include "tedsim/runtime/kernel_census.hpp"

#include <chrono>

namespace tedsim::runtime {
namespace {

class CensusOps final : public StepOps {
 public:
  CensusOps(std::unique_ptr<StepOps> inner, KernelCensus& census) : in_(std::move(inner)), c_(census) {}
  Backend backend() const override { return in_->backend(); }
  MemorySpace& memory() override { return in_->memory(); }
  void fence() override { in_->fence(); }

  void copy(float* dst, const float* src, std::size_t n) override {
    const Call call = count("copy", double(n));
    in_->copy(dst, src, n);
  }
  void copy_rows(float* dst, std::size_t ds, const float* src, std::size_t ss, std::size_t len, std::size_t rows) override {
    const Call call = count("copy_rows", double(len) * double(rows));
    in_->copy_rows(dst, ds, src, ss, len, rows);
  }
  void to_host(const float* src, float* dst, std::size_t n) override {
    const Call call = count("to_host", double(n));
    in_->to_host(src, dst, n);
  }
  void from_host(const float* src, float* dst, std::size_t n) override {
    const Call call = count("from_host", double(n));
    in_->from_host(src, dst, n);
  }
  void gemm(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
            int ldc) override {
    const Call call = count("gemm", double(m) * double(n));
    in_->gemm(op, m, n, k, a, lda, b, ldb, c, ldc);
  }
  void gemm_weight(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* w, int ldw,
                   float* c, int ldc) override {
    const Call call = count("gemm", double(m) * double(n));  // the same kernel as gemm's, priced alike
    in_->gemm_weight(op, m, n, k, a, lda, w, ldw, c, ldc);
  }
  void parameters_changed() override { in_->parameters_changed(); }
  void add_into(std::size_t n, const float* a, float* y) override {
    const Call call = count("add_into", double(n));
    in_->add_into(n, a, y);
  }
  void layernorm_forward(int rows, int h, float eps, const float* x, const float* g, const float* b, float* y, float* mean,
                         float* rstd) override {
    const Call call = count("layernorm_forward", double(rows) * h);
    in_->layernorm_forward(rows, h, eps, x, g, b, y, mean, rstd);
  }
  void layernorm_backward(int rows, int h, const float* x, const float* g, const float* mean, const float* rstd,
                          const float* gy, float* gx, float* gg, float* gb) override {
    const Call call = count("layernorm_backward", double(rows) * h);
    in_->layernorm_backward(rows, h, x, g, mean, rstd, gy, gx, gg, gb);
  }
  void rmsnorm_forward(int rows, int h, float eps, const float* x, const float* g, float* y, float* rstd) override {
    const Call call = count("rmsnorm_forward", double(rows) * h);
    in_->rmsnorm_forward(rows, h, eps, x, g, y, rstd);
  }
  void rmsnorm_backward(int rows, int h, const float* x, const float* g, const float* rstd, const float* gy, float* gx,
                        float* gg) override {
    const Call call = count("rmsnorm_backward", double(rows) * h);
    in_->rmsnorm_backward(rows, h, x, g, rstd, gy, gx, gg);
  }
  void rotary_forward(int rows, int seq, int heads, int hd, int rd, int stride, const float* cos, const float* sin,
                      float* x) override {
    const Call call = count("rotary_forward", double(rows) * heads * rd);
    in_->rotary_forward(rows, seq, heads, hd, rd, stride, cos, sin, x);
  }
  void rotary_backward(int rows, int seq, int heads, int hd, int rd, int stride, const float* cos, const float* sin,
                       float* g) override {
    const Call call = count("rotary_backward", double(rows) * heads * rd);
    in_->rotary_backward(rows, seq, heads, hd, rd, stride, cos, sin, g);
  }
  void gelu_forward(std::size_t n, const float* x, float* y) override {
    const Call call = count("gelu_forward", double(n));
    in_->gelu_forward(n, x, y);
  }
  void gelu_backward(std::size_t n, const float* x, const float* gy, float* gx) override {
    const Call call = count("gelu_backward", double(n));
    in_->gelu_backward(n, x, gy, gx);
  }
  void swiglu_forward(int rows, int ffn, const float* x, float* y) override {
    const Call call = count("swiglu_forward", double(rows) * ffn);
    in_->swiglu_forward(rows, ffn, x, y);
  }
  void swiglu_backward(int rows, int ffn, const float* x, const float* gy, float* gx) override {
    const Call call = count("swiglu_backward", double(rows) * ffn);
    in_->swiglu_backward(rows, ffn, x, gy, gx);
  }
  void attention_forward(int heads, int seq, int hd, int vd, const float* q, const float* k, const float* v,
                         float* probs, float* out) override {
    const Call call = count("attention_forward", double(heads) * seq * seq);
    in_->attention_forward(heads, seq, hd, vd, q, k, v, probs, out);
  }
  void attention_backward(int heads, int seq, int hd, int vd, const float* q, const float* k, const float* v,
                          const float* probs, const float* go, float* gq, float* gk, float* gv) override {
    const Call call = count("attention_backward", double(heads) * seq * seq);
    in_->attention_backward(heads, seq, hd, vd, q, k, v, probs, go, gq, gk, gv);
  }
  void adam_step(std::size_t n, const kernels::AdamConfig& cfg, int step, float* p, const float* g, float* m,
                 float* v) override {
    const Call call = count("adam_step", double(n));
    in_->adam_step(n, cfg, step, p, g, m, v);
  }
  void split_heads(const HeadShape& s, const float* qkv, float* q, float* k, float* v) override {
    const Call call = count("split_heads", 0);
    in_->split_heads(s, qkv, q, k, v);
  }
  void merge_heads_grad(const HeadShape& s, const float* gq, const float* gk, const float* gv, float* gqkv) override {
    const Call call = count("merge_heads_grad", 0);
    in_->merge_heads_grad(s, gq, gk, gv, gqkv);
  }
  void heads_to_tokens(const HeadShape& s, const float* src, float* dst) override {
    const Call call = count("heads_to_tokens", 0);
    in_->heads_to_tokens(s, src, dst);
  }
  void tokens_to_heads(const HeadShape& s, const float* src, float* dst) override {
    const Call call = count("tokens_to_heads", 0);
    in_->tokens_to_heads(s, src, dst);
  }
  std::unique_ptr<Routing> make_routing() override { return in_->make_routing(); }
  void gating_forward(const float* logits, int tokens, int experts, const kernels::GatingConfig& cfg, Routing& out) override {
    const Call call = count("gating_forward", double(tokens) * experts);
    in_->gating_forward(logits, tokens, experts, cfg, out);
  }
  double aux_loss(const Routing& r) override {
    const Call call = count("aux_loss", 0);
    return in_->aux_loss(r);
  }
  void routing_choices(const Routing& r, std::vector<std::int32_t>& e, std::vector<std::int32_t>& p) override {
    const Call call = count("routing_choices", 0);
    in_->routing_choices(r, e, p);
  }
  void dispatch(const Routing& r, const float* x, int h, float* buf) override {
    const Call call = count("dispatch", 0);
    in_->dispatch(r, x, h, buf);
  }
  void combine(const Routing& r, const float* buf, int h, float* out) override {
    const Call call = count("combine", 0);
    in_->combine(r, buf, h, out);
  }
  void dispatch_backward(const Routing& r, const float* gb, int h, float* gx) override {
    const Call call = count("dispatch_backward", 0);
    in_->dispatch_backward(r, gb, h, gx);
  }
  void combine_backward(const Routing& r, const float* buf, const float* go, int h, float* gb, float* gw) override {
    const Call call = count("combine_backward", 0);
    in_->combine_backward(r, buf, go, h, gb, gw);
  }
  void gating_backward(const Routing& r, const float* gw, float ga, float* gl) override {
    const Call call = count("gating_backward", 0);
    in_->gating_backward(r, gw, ga, gl);
  }
  void route_forward(const float* logits, int tokens, int experts, const kernels::RouterConfig& cfg, Routing& out) override {
    const Call call = count("route_forward", double(tokens) * experts);
    in_->route_forward(logits, tokens, experts, cfg, out);
  }
  void aux_statistics(const Routing& r, float* host_stats) override {
    const Call call = count("aux_statistics", 0);
    in_->aux_statistics(r, host_stats);
  }
  void set_group_aux(Routing& r, const float* host_group_stats, int group_tokens) override {
    const Call call = count("set_group_aux", 0);
    in_->set_group_aux(r, host_group_stats, group_tokens);
  }
  void routing_counts(const Routing& r, std::vector<std::int32_t>& kept) override {
    const Call call = count("routing_counts", 0);
    in_->routing_counts(r, kept);
  }
  int routing_capacity(const Routing& r) override { return in_->routing_capacity(r); }
  void embedding_forward(int tokens, int h, int v0, int vl, const std::int32_t* ids, const float* table, float* out) override {
    const Call call = count("embedding_forward", double(tokens) * h);
    in_->embedding_forward(tokens, h, v0, vl, ids, table, out);
  }
  void embedding_backward(int tokens, int h, int v0, int vl, const std::int32_t* ids, const float* go, float* tg) override {
    const Call call = count("embedding_backward", double(tokens) * h);
    in_->embedding_backward(tokens, h, v0, vl, ids, go, tg);
  }
  void ce_max_and_target(int tokens, int vl, int v0, const float* logits, const std::int32_t* t, float* mx, float* tl) override {
    const Call call = count("ce_max_and_target", double(tokens) * vl);
    in_->ce_max_and_target(tokens, vl, v0, logits, t, mx, tl);
  }
  void ce_exp_and_sum(int tokens, int vl, const float* mx, float* logits, float* sum) override {
    const Call call = count("ce_exp_and_sum", double(tokens) * vl);
    in_->ce_exp_and_sum(tokens, vl, mx, logits, sum);
  }
  void ce_gradient(int tokens, int vl, int v0, const std::int32_t* t, const float* sum, float scale, float* logits) override {
    const Call call = count("ce_gradient", double(tokens) * vl);
    in_->ce_gradient(tokens, vl, v0, t, sum, scale, logits);
  }

 private:
  // One kernel call, timed from its start to the end of its scope: on the CPU backend every call
  // returns when its work is done; on CUDA the call is fenced first when the census times calls.
  class Call {
   public:
    Call(CensusOps& ops, KernelCount& k) : ops_(ops), k_(k), t0_(std::chrono::steady_clock::now()) {}
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    ~Call() {
      if (ops_.c_.fence_each_call) ops_.in_->fence();
      k_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }

   private:
    CensusOps& ops_;
    KernelCount& k_;
    std::chrono::steady_clock::time_point t0_;
  };
  Call count(const char* name, double floats) { return Call(*this, c_.add(name, floats)); }

  std::unique_ptr<StepOps> in_;
  KernelCensus& c_;
};

}  // namespace

std::unique_ptr<StepOps> with_census(std::unique_ptr<StepOps> inner, KernelCensus& census) {
  return std::make_unique<CensusOps>(std::move(inner), census);
}

}  // namespace tedsim::runtime
