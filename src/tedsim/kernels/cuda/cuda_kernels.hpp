#pragma once
// CUDA kernels of a TED step, callable from plain C++: no CUDA headers here, device memory is
// passed as plain pointers obtained from DeviceBuffer. Storage dtypes fp32/fp16/bf16; arithmetic
// is fp32 (GEMMs: tensor cores with CUBLAS_COMPUTE_32F). All work is queued on the default stream;
// call synchronize() before reading results. Failures throw tedsim::RunError naming file:line.
// Only available when built with CUDA (target tedsim_kernels_cuda); check cuda_device_count() > 0
// before calling anything here.
#include <cstddef>
#include <memory>
#include <vector>

#include "tedsim/core/units.hpp"
#include "tedsim/kernels/cpu/adam.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gemm.hpp"

namespace tedsim::kernels::cuda {

// Owning device allocation (cudaMalloc); move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  template <class T>
  T* as() { return static_cast<T*>(ptr_); }
  template <class T>
  const T* as() const { return static_cast<const T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host, std::size_t bytes);          // synchronous
  void download(void* host, std::size_t bytes) const;        // synchronous
  void zero();

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

void synchronize();  // waits for the device; throws RunError on an asynchronous kernel error

// Element conversions between fp32 and a storage dtype, both pointers on the device.
void convert_from_fp32(const float* src, Dtype dst_type, void* dst, std::size_t n);
void convert_to_fp32(const void* src, Dtype src_type, float* dst, std::size_t n);

// cuBLAS + cuBLASLt handles and a cuBLASLt workspace; create once, reuse.
class BlasHandle {
 public:
  BlasHandle();
  ~BlasHandle();
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Row-major GEMM with the CPU gemm()'s semantics (see cpu/gemm.hpp); A, B, C all of `type`,
// fp32 accumulation. gemm: cublasGemmEx; gemm_lt: cublasLtMatmul (heuristic algorithm).
void gemm(BlasHandle& h, Dtype type, const GemmOp& op, int m, int n, int k, const void* a, int lda, const void* b,
          int ldb, void* c, int ldc);
void gemm_lt(BlasHandle& h, Dtype type, const GemmOp& op, int m, int n, int k, const void* a, int lda,
             const void* b, int ldb, void* c, int ldc);
// Equal shapes, strided batch (e.g. local experts at full capacity): cublasGemmStridedBatchedEx.
void gemm_strided_batched(BlasHandle& h, Dtype type, const GemmOp& op, int m, int n, int k, const void* a, int lda,
                          long long stride_a, const void* b, int ldb, long long stride_b, void* c, int ldc,
                          long long stride_c, int batch);
// The same with fp32 operands the tensor cores round to TF32 (the step's attention core).
void gemm_strided_batched_tf32(BlasHandle& h, const GemmOp& op, int m, int n, int k, const float* a, int lda,
                               long long stride_a, const float* b, int ldb, long long stride_b, float* c, int ldc,
                               long long stride_c, int batch);
struct DeviceGemmProblem {
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  void* c = nullptr;
  int ldc = 0;
};
// Per-expert shapes (m = kept tokens): a loop of gemm calls on one stream.
void gemm_grouped(BlasHandle& h, Dtype type, const GemmOp& op, const std::vector<DeviceGemmProblem>& problems);

// Element-wise / normalization kernels; x and y in `type`, gamma/beta/mean/rstd fp32.
void layernorm_forward(Dtype type, int rows, int hidden, float eps, const void* x, const float* gamma,
                       const float* beta, void* y, float* mean, float* rstd);
void gelu_forward(Dtype type, std::size_t n, const void* x, void* y);
void gelu_backward(Dtype type, std::size_t n, const void* x, const void* grad_y, void* grad_x);
void swiglu_forward(Dtype type, int rows, int ffn, const void* x, void* y);
void adam_step(std::size_t n, const AdamConfig& cfg, int step, float* params, const float* grads, float* exp_avg,
               float* exp_avg_sq);

// Gating (same semantics as cpu/gating.hpp) on fp32 logits. Outputs live in device buffers.
struct DeviceGating {
  int tokens = 0, experts = 0, k = 0, capacity = 0;
  int aux_tokens = 0;  // the balance loss's tokens where a tensor group shares it (sequence parallelism); 0: tokens
  DeviceBuffer probs, expert, position, weight, routed, kept, top1_count, prob_sum, aux_loss;
  // Copies everything back into the CPU struct (synchronous), e.g. to compare with the CPU kernel.
  void download(GatingOutput& out) const;
};
void gating_forward(const float* logits, int tokens, int experts, const GatingConfig& cfg, DeviceGating& out);

// Dispatch [T,h] -> [E,C,h] (empty slots zero) and combine [E,C,h] -> [T,h] with fp32 weights
// (weight null: every weight 1);
// x, buf, out in `type`. expert/position/weight are [T,k] device arrays (e.g. from DeviceGating).
void dispatch(Dtype type, int tokens, int k, int experts, int capacity, int hidden, const int* expert,
              const int* position, const void* x, void* buf);
void combine(Dtype type, int tokens, int k, int experts, int capacity, int hidden, const int* expert,
             const int* position, const float* weight, const void* buf, void* out);

// Attention core forward, fp32, [heads, s, d]: one block per query row, the score row in shared
// memory (s up to ~12k floats by default, more where the device allows; InputError beyond).
void attention_forward(int heads, int seq, int head_dim, bool causal, const float* q, const float* k, const float* v,
                       float* out);

}  // namespace tedsim::kernels::cuda
