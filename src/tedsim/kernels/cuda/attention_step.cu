// Attention core of the training step, fp32 storage: queries and keys [heads, s, dk], values and
// outputs [heads, s, dv] (MLA's value heads differ from its query/key heads), the probabilities
// [heads, s, s] saved by the forward pass (cpu/attention.cpp is the reference).
//
// This is the unfused attention Megatron runs without a flash kernel, and the one tedsim prices
// when a profile has no flash rates: batched GEMMs on the tensor cores, a row kernel between them.
//   forward:  S = scale Q K^T;  P = softmax(S) by rows, the causal mask's entries exactly 0;  O = P V
//   backward: dV = P^T dO;  dP = dO V^T;  dS = P (dP - rowsum(P dP));  dQ = scale dS K;
//             dK = scale dS^T Q
// The GEMMs keep fp32 operands and let the tensor cores round them to TF32 (10 mantissa bits):
// the probabilities and their gradients are where bf16 rounding would show most, and attention's
// share of the step's FLOPs is small enough that TF32's half rate costs little.
// The backward queues a stream-ordered scratch of heads * s * s floats for dP / dS.
#include <cmath>
#include <cstdint>
#include <string>

#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/launch_limits.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

// One block per row of one head: scores become probabilities in place; entries past the causal
// diagonal become 0, as the CPU reference leaves them.
__global__ void softmax_rows_kernel(int seq, bool causal, float* p) {
  __shared__ float scratch[32];
  const std::size_t r = blockIdx.x;  // head * seq + i
  const int i = static_cast<int>(r % seq);
  const int valid = causal ? i + 1 : seq;
  float* row = p + r * seq;
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) local_max = fmaxf(local_max, row[j]);
  const float m = detail::block_max(local_max, scratch);
  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) {
    const float e = expf(row[j] - m);
    row[j] = e;
    local_sum += e;
  }
  const float inv = 1.0f / detail::block_sum(local_sum, scratch);
  for (int j = threadIdx.x; j < seq; j += blockDim.x) row[j] = j < valid ? row[j] * inv : 0.0f;
}

// dS = P (dP - D) by rows, D = sum_j P_ij dP_ij; dP is overwritten with dS. Masked entries have
// P == 0 and so dS == 0.
__global__ void softmax_backward_rows_kernel(int seq, const float* p, float* dp) {
  __shared__ float scratch[32];
  const std::size_t r = blockIdx.x;
  const float* prow = p + r * seq;
  float* row = dp + r * seq;
  float local = 0.0f;
  for (int j = threadIdx.x; j < seq; j += blockDim.x) local += prow[j] * row[j];
  const float dot = detail::block_sum(local, scratch);
  for (int j = threadIdx.x; j < seq; j += blockDim.x) row[j] = prow[j] * (row[j] - dot);
}

// Stream-ordered allocations of this device's default pool stay in the pool when freed (its
// release threshold would otherwise hand them back at every synchronize, and the backward step's
// scratch would be mapped again inside every timed phase).
void keep_async_allocations() {
  static bool done = false;
  if (done) return;
  int device = 0;
  cudaMemPool_t pool = nullptr;
  TEDSIM_CUDA_CHECK(cudaGetDevice(&device));
  TEDSIM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t keep_all = UINT64_MAX;
  TEDSIM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  done = true;
}

float softmax_scale(int head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

// C_h = alpha op(A_h) op(B_h) for every head h, row-major, TF32 tensor cores.
void per_head(BlasHandle& blas, bool trans_a, bool trans_b, float alpha, int heads, int m, int n, int k,
              const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  GemmOp op;
  op.trans_a = trans_a;
  op.trans_b = trans_b;
  op.alpha = alpha;
  const long long stride_a = static_cast<long long>(m) * k, stride_b = static_cast<long long>(n) * k;
  gemm_strided_batched_tf32(blas, op, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc,
                            static_cast<long long>(m) * n, heads);
}

int row_block(int seq) { return detail::row_threads(seq, 1024); }

}  // namespace

void attention_forward_saving_probs(BlasHandle& blas, int heads, int seq, int head_dim, int v_dim, bool causal,
                                    const float* q, const float* k, const float* v, float* probs, float* out) {
  if (heads <= 0 || seq <= 0) return;
  const std::size_t rows = static_cast<std::size_t>(heads) * seq;
  detail::check_rows(rows, "cuda::attention_forward_saving_probs");
  per_head(blas, false, true, softmax_scale(head_dim), heads, seq, seq, head_dim, q, head_dim, k, head_dim, probs,
           seq);
  softmax_rows_kernel<<<static_cast<unsigned>(rows), row_block(seq)>>>(seq, causal, probs);
  TEDSIM_CUDA_CHECK_LAUNCH();
  per_head(blas, false, false, 1.0f, heads, seq, v_dim, seq, probs, seq, v, v_dim, out, v_dim);
}

void attention_backward(BlasHandle& blas, int heads, int seq, int head_dim, int v_dim, const float* q,
                        const float* k, const float* v, const float* probs, const float* grad_out, float* grad_q,
                        float* grad_k, float* grad_v) {
  if (heads <= 0 || seq <= 0) return;
  const std::size_t rows = static_cast<std::size_t>(heads) * seq;
  detail::check_rows(rows, "cuda::attention_backward");
  const float scale = softmax_scale(head_dim);
  per_head(blas, true, false, 1.0f, heads, seq, v_dim, seq, probs, seq, grad_out, v_dim, grad_v, v_dim);
  keep_async_allocations();
  float* ds = nullptr;  // dP, then dS, between the GEMMs only
  TEDSIM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ds), rows * seq * sizeof(float), 0));
  per_head(blas, false, true, 1.0f, heads, seq, seq, v_dim, grad_out, v_dim, v, v_dim, ds, seq);
  softmax_backward_rows_kernel<<<static_cast<unsigned>(rows), row_block(seq)>>>(seq, probs, ds);
  const cudaError_t launch = cudaGetLastError();
  if (launch == cudaSuccess) {
    per_head(blas, false, false, scale, heads, seq, head_dim, seq, ds, seq, k, head_dim, grad_q, head_dim);
    per_head(blas, true, false, scale, heads, seq, head_dim, seq, ds, seq, q, head_dim, grad_k, head_dim);
  }
  // Freed in stream order whether or not the launch worked, then its error is reported.
  TEDSIM_CUDA_CHECK(cudaFreeAsync(ds, 0));
  TEDSIM_CUDA_CHECK(launch);
}

}  // namespace tedsim::kernels::cuda
