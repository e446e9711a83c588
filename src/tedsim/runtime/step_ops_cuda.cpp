// StepOps on a CUDA device: tensors in device memory, GEMMs on bf16 tensor cores with fp32
// operands and accumulation (fp32 master weights and activations; the weights' bf16 copies made
// once per step, weight_copies.hpp), every other operation a CUDA kernel of kernels/cuda. Built
// only with CUDA (see CMakeLists.txt).
//
// Host arrays the interface hands over (token ids, targets) are uploaded into small device
// buffers; scalars the trainer needs on the host (the aux loss, routing choices) are downloaded.
#include <cstring>
#include <unordered_map>

#include "tedsim/core/error.hpp"

#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"
#include "tedsim/runtime/step_ops.hpp"
#include "tedsim/runtime/weight_copies.hpp"

namespace tedsim::runtime {
namespace {

namespace cu = kernels::cuda;

// Device memory with a cache of freed blocks by exact size, as PyTorch's caching allocator does:
// cudaFree synchronizes the device and cudaMalloc of large blocks takes milliseconds, and the step
// frees and re-allocates the same sizes every micro-batch (CAC stashes, backward scratch). Reuse
// is safe because every kernel runs on the default stream and collectives are waited for before
// the step goes on. Cached blocks are not counted as live tensor memory (MemoryCounter), like
// PyTorch's "reserved" against "allocated".
class DeviceMemory final : public MemorySpace {
 public:
  ~DeviceMemory() override { release_cache(); }
  void* allocate(std::size_t bytes) override {
    auto it = cache_.find(bytes);
    if (it != cache_.end()) {
      void* ptr = it->second;
      cache_.erase(it);
      sizes_[ptr] = bytes;
      return ptr;
    }
    void* ptr = nullptr;
    try {
      ptr = cu::device_malloc(bytes);
    } catch (const RunError&) {  // out of memory: give the cached blocks back and try once more
      release_cache();
      ptr = cu::device_malloc(bytes);
    }
    sizes_[ptr] = bytes;
    return ptr;
  }
  void deallocate(void* ptr) noexcept override {
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) return;
    try {
      cache_.emplace(it->second, ptr);
    } catch (...) {  // no memory for the cache entry: free the block instead
      cu::device_free(ptr);
    }
    sizes_.erase(it);
  }
  void zero(void* ptr, std::size_t bytes) override { cu::fill_zero(ptr, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override { cu::copy(dst, src, bytes); }
  void upload(void* dst, const void* host_src, std::size_t bytes) override { cu::copy(dst, host_src, bytes); }

 private:
  void release_cache() noexcept {
    for (auto& [bytes, ptr] : cache_) cu::device_free(ptr);
    cache_.clear();
  }
  std::unordered_multimap<std::size_t, void*> cache_;  // freed blocks by size
  std::unordered_map<void*, std::size_t> sizes_;       // live blocks
};

struct CudaRouting final : Routing {
  cu::DeviceGating gate;    // DeepSpeed's fused gating
  cu::DeviceRouter router;  // or one of today's routers
  bool generic = false;     // which of the two the last forward ran
};
const cu::DeviceGating& gate_of(const Routing& r) {
  const auto& c = static_cast<const CudaRouting&>(r);
  return c.generic ? c.router.gate : c.gate;
}

class CudaStepOps final : public StepOps {
 public:
  explicit CudaStepOps(bool weight_copies) : weight_copies_(weight_copies) {}
  Backend backend() const override { return Backend::cuda; }
  MemorySpace& memory() override { return memory_; }
  void fence() override { cu::synchronize(); }

  void copy(float* dst, const float* src, std::size_t n) override {
    if (n && dst != src) cu::copy(dst, src, n * sizeof(float));
  }
  void copy_rows(float* dst, std::size_t dst_stride, const float* src, std::size_t src_stride, std::size_t row_len,
                 std::size_t rows) override {
    if (rows && row_len)
      cu::copy_2d(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float), row_len * sizeof(float), rows);
  }
  void to_host(const float* src, float* host_dst, std::size_t n) override { cu::copy(host_dst, src, n * sizeof(float)); }
  void from_host(const float* host_src, float* dst, std::size_t n) override {
    cu::copy(dst, host_src, n * sizeof(float));
  }

  void gemm(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
            int ldc) override {
    cu::gemm_bf16_compute(blas_, op, m, n, k, a, lda, b, ldb, c, ldc);
  }
  void gemm_weight(const kernels::GemmOp& op, int m, int n, int k, const float* a, int lda, const float* w, int ldw,
                   float* c, int ldc) override {
    const int w_rows = op.trans_b ? n : k, w_cols = op.trans_b ? k : n;
    if (!weight_copies_ || w_rows <= 0 || w_cols <= 0 || m <= 0) {
      gemm(op, m, n, k, a, lda, w, ldw, c, ldc);
      return;
    }
    bool stale = false;
    void* w16 = copies_.find(w, w_rows, w_cols, ldw, stale);
    if (stale) cu::convert_rows_to_bf16(w_rows, w_cols, w, ldw, w16);
    cu::gemm_bf16_compute_rounded_b(blas_, op, m, n, k, a, lda, w16, c, ldc);
  }
  void parameters_changed() override { copies_.invalidate(); }
  void add_into(std::size_t n, const float* a, float* y) override { cu::add_into(n, a, y); }
  void layernorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, const float* beta,
                         float* y, float* mean, float* rstd) override {
    cu::layernorm_forward(Dtype::fp32, rows, hidden, eps, x, gamma, beta, y, mean, rstd);
  }
  void rmsnorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, float* y,
                       float* rstd) override {
    cu::rmsnorm_forward(rows, hidden, eps, x, gamma, y, rstd);
  }
  void rmsnorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* rstd,
                        const float* grad_y, float* grad_x, float* grad_gamma) override {
    cu::rmsnorm_backward(rows, hidden, x, gamma, rstd, grad_y, grad_x, grad_gamma);
  }
  void rotary_forward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                      const float* sin, float* x) override {
    cu::rotary_forward(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, x);
  }
  void rotary_backward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                       const float* sin, float* grad) override {
    cu::rotary_backward(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, grad);
  }
  void layernorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* mean,
                          const float* rstd, const float* grad_y, float* grad_x, float* grad_gamma,
                          float* grad_beta) override {
    cu::layernorm_backward(rows, hidden, x, gamma, mean, rstd, grad_y, grad_x, grad_gamma, grad_beta);
  }
  void gelu_forward(std::size_t n, const float* x, float* y) override { cu::gelu_forward(Dtype::fp32, n, x, y); }
  void gelu_backward(std::size_t n, const float* x, const float* grad_y, float* grad_x) override {
    cu::gelu_backward(Dtype::fp32, n, x, grad_y, grad_x);
  }
  void swiglu_forward(int rows, int ffn, const float* x, float* y) override {
    cu::swiglu_forward(Dtype::fp32, rows, ffn, x, y);
  }
  void swiglu_backward(int rows, int ffn, const float* x, const float* grad_y, float* grad_x) override {
    cu::swiglu_backward(rows, ffn, x, grad_y, grad_x);
  }
  void attention_forward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k, const float* v,
                         float* probs, float* out) override {
    cu::attention_forward_saving_probs(blas_, heads, seq, head_dim, v_dim, true, q, k, v, probs, out);
  }
  void attention_backward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k, const float* v,
                          const float* probs, const float* grad_out, float* grad_q, float* grad_k,
                          float* grad_v) override {
    cu::attention_backward(blas_, heads, seq, head_dim, v_dim, q, k, v, probs, grad_out, grad_q, grad_k, grad_v);
  }
  void adam_step(std::size_t n, const kernels::AdamConfig& cfg, int step, float* params, const float* grads,
                 float* exp_avg, float* exp_avg_sq) override {
    cu::adam_step(n, cfg, step, params, grads, exp_avg, exp_avg_sq);
  }

  void split_heads(const HeadShape& s, const float* qkv, float* q, float* k, float* v) override {
    cu::split_heads(s.b, s.s, s.heads, s.kv_heads, s.head_dim, qkv, q, k, v);
  }
  void merge_heads_grad(const HeadShape& s, const float* gq, const float* gk, const float* gv, float* gqkv) override {
    cu::merge_heads_grad(s.b, s.s, s.heads, s.kv_heads, s.head_dim, gq, gk, gv, gqkv);
  }
  void heads_to_tokens(const HeadShape& s, const float* src, float* dst) override {
    cu::heads_to_tokens(s.b, s.s, s.heads, s.head_dim, src, dst);
  }
  void tokens_to_heads(const HeadShape& s, const float* src, float* dst) override {
    cu::tokens_to_heads(s.b, s.s, s.heads, s.head_dim, src, dst);
  }

  std::unique_ptr<Routing> make_routing() override { return std::make_unique<CudaRouting>(); }
  void route_forward(const float* logits, int tokens, int experts, const kernels::RouterConfig& cfg,
                     Routing& out) override {
    auto& r = static_cast<CudaRouting&>(out);
    r.generic = true;
    cu::route_forward(logits, tokens, experts, cfg, r.router);
  }
  void routing_counts(const Routing& r, std::vector<std::int32_t>& kept) override {
    const cu::DeviceGating& g = gate_of(r);
    kept.resize(static_cast<std::size_t>(g.experts));
    if (g.experts > 0) cu::copy(kept.data(), g.kept.data(), kept.size() * sizeof(std::int32_t));
  }
  int routing_capacity(const Routing& r) override { return gate_of(r).capacity; }
  void aux_statistics(const Routing&, float*) override {
    throw RunError("the CUDA step does not run sequence parallelism yet (its router statistics are not built)");
  }
  void set_group_aux(Routing&, const float*, int) override {
    throw RunError("the CUDA step does not run sequence parallelism yet (its router statistics are not built)");
  }
  void gating_forward(const float* logits, int tokens, int experts, const kernels::GatingConfig& cfg,
                      Routing& out) override {
    auto& r = static_cast<CudaRouting&>(out);
    r.generic = false;
    cu::gating_forward(logits, tokens, experts, cfg, r.gate);
  }
  double aux_loss(const Routing& r) override {
    const cu::DeviceGating& g = gate_of(r);
    float aux = 0.0f;
    if (g.tokens > 0) cu::copy(&aux, g.aux_loss.data(), sizeof aux);
    return aux;
  }
  void routing_choices(const Routing& r, std::vector<std::int32_t>& expert,
                       std::vector<std::int32_t>& position) override {
    const cu::DeviceGating& g = gate_of(r);
    const std::size_t n = static_cast<std::size_t>(g.tokens) * g.k;
    expert.resize(n);
    position.resize(n);
    if (n == 0) return;
    cu::copy(expert.data(), g.expert.data(), n * sizeof(std::int32_t));
    cu::copy(position.data(), g.position.data(), n * sizeof(std::int32_t));
  }
  void dispatch(const Routing& r, const float* x, int hidden, float* buf) override {
    const cu::DeviceGating& g = gate_of(r);
    cu::dispatch(Dtype::fp32, g.tokens, g.k, g.experts, g.capacity, hidden, g.expert.as<int>(), g.position.as<int>(),
                 x, buf);
  }
  void combine(const Routing& r, const float* buf, int hidden, float* out) override {
    const cu::DeviceGating& g = gate_of(r);
    cu::combine(Dtype::fp32, g.tokens, g.k, g.experts, g.capacity, hidden, g.expert.as<int>(), g.position.as<int>(),
                g.weight.as<float>(), buf, out);
  }
  void dispatch_backward(const Routing& r, const float* grad_buf, int hidden, float* grad_x) override {
    const cu::DeviceGating& g = gate_of(r);
    cu::dispatch_backward(g.tokens, g.k, g.experts, g.capacity, hidden, g.expert.as<int>(), g.position.as<int>(),
                          grad_buf, grad_x);
  }
  void combine_backward(const Routing& r, const float* buf, const float* grad_out, int hidden, float* grad_buf,
                        float* grad_weight) override {
    const cu::DeviceGating& g = gate_of(r);
    cu::combine_backward(g.tokens, g.k, g.experts, g.capacity, hidden, g.expert.as<int>(), g.position.as<int>(),
                         g.weight.as<float>(), buf, grad_out, grad_buf, grad_weight);
  }
  void gating_backward(const Routing& r, const float* grad_weight, float grad_aux, float* grad_logits) override {
    const auto& c = static_cast<const CudaRouting&>(r);
    if (c.generic)
      cu::route_backward(c.router, grad_weight, grad_aux, grad_logits);
    else
      cu::gating_backward(c.gate, grad_weight, grad_aux, grad_logits);
  }

  void embedding_forward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* table,
                         float* out) override {
    cu::embedding_forward(tokens, hidden, v0, v_local, upload_ids(ids_, ids, tokens), table, out);
  }
  void embedding_backward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* grad_out,
                          float* table_grad) override {
    cu::embedding_backward(tokens, hidden, v0, v_local, upload_ids(ids_, ids, tokens), grad_out, table_grad);
  }
  void ce_max_and_target(int tokens, int v_local, int v0, const float* logits, const std::int32_t* targets,
                         float* row_max, float* target_logit) override {
    cu::ce_max_and_target(tokens, v_local, v0, logits, upload_ids(targets_, targets, tokens), row_max, target_logit);
  }
  void ce_exp_and_sum(int tokens, int v_local, const float* row_max, float* logits, float* row_sum) override {
    cu::ce_exp_and_sum(tokens, v_local, row_max, logits, row_sum);
  }
  void ce_gradient(int tokens, int v_local, int v0, const std::int32_t* targets, const float* row_sum, float scale,
                   float* logits) override {
    cu::ce_gradient(tokens, v_local, v0, upload_ids(targets_, targets, tokens), row_sum, scale, logits);
  }

 private:
  // Uploads n host ids into `buf` (grown as needed) and returns its device pointer.
  static const std::int32_t* upload_ids(cu::DeviceBuffer& buf, const std::int32_t* host, int n) {
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(std::int32_t);
    if (buf.bytes() < bytes) buf = cu::DeviceBuffer(bytes);
    if (bytes) buf.upload(host, bytes);
    return buf.as<std::int32_t>();
  }

  bool weight_copies_;
  DeviceMemory memory_;
  cu::BlasHandle blas_;
  cu::DeviceBuffer ids_, targets_;
  WeightCopies copies_{memory_, 2};  // packed bf16; after memory_, which must outlive it
};

}  // namespace

std::unique_ptr<StepOps> make_cuda_step_ops(bool weight_copies) { return std::make_unique<CudaStepOps>(weight_copies); }

}  // namespace tedsim::runtime
