// Embedding and vocabulary-parallel cross-entropy on the device, mirroring the loops of
// runtime/layers/embedding.cpp and lm_head.cpp. Each rank owns the
// vocabulary rows [v0, v0 + v_local); the row max and the exp sum are all-reduced by the caller
// between the three cross-entropy steps. The loss kernels use one block per token row.
#include <cmath>

#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

// Index of `id` in this rank's vocabulary slice, or -1 when another rank owns it.
__device__ __forceinline__ int owned_row(std::int32_t id, int v0, int v_local) {
  const long long local = static_cast<long long>(id) - v0;
  return local >= 0 && local < v_local ? static_cast<int>(local) : -1;
}

__global__ void embedding_forward_kernel(int hidden, std::size_t n, int v0, int v_local, const std::int32_t* ids,
                                         const float* table, float* out) {
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) {
    const std::size_t t = i / hidden, c = i % hidden;
    const int row = owned_row(ids[t], v0, v_local);
    out[i] = row >= 0 ? table[static_cast<std::size_t>(row) * hidden + c] : 0.0f;
  }
}

__global__ void embedding_backward_kernel(int hidden, std::size_t n, int v0, int v_local, const std::int32_t* ids,
                                          const float* grad_out, float* table_grad) {
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) {
    const std::size_t t = i / hidden, c = i % hidden;
    const int row = owned_row(ids[t], v0, v_local);
    if (row >= 0) atomicAdd(&table_grad[static_cast<std::size_t>(row) * hidden + c], grad_out[i]);
  }
}

__global__ void ce_max_and_target_kernel(int v_local, int v0, const float* logits, const std::int32_t* targets,
                                         float* row_max, float* target_logit) {
  __shared__ float scratch[32];
  const std::size_t t = blockIdx.x;
  const float* row = logits + t * v_local;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < v_local; v += blockDim.x) m = fmaxf(m, row[v]);
  m = detail::block_max(m, scratch);
  if (threadIdx.x == 0) {
    row_max[t] = m;
    const int id = owned_row(targets[t], v0, v_local);
    target_logit[t] = id >= 0 ? row[id] : 0.0f;
  }
}

// The row sum is accumulated in double, as the CPU loop does: vocabulary rows are long.
__global__ void ce_exp_and_sum_kernel(int v_local, const float* row_max, float* logits, float* row_sum) {
  __shared__ double scratch[32];
  const std::size_t t = blockIdx.x;
  float* row = logits + t * v_local;
  const float m = row_max[t];
  double sum = 0.0;
  for (int v = threadIdx.x; v < v_local; v += blockDim.x) {
    const float e = expf(row[v] - m);
    row[v] = e;
    sum += e;
  }
  sum = detail::block_sum(sum, scratch);
  if (threadIdx.x == 0) row_sum[t] = static_cast<float>(sum);
}

__global__ void ce_gradient_kernel(int v_local, int v0, const std::int32_t* targets, const float* row_sum,
                                   float scale, float* logits) {
  const std::size_t t = blockIdx.x;
  float* row = logits + t * v_local;
  const float inv = scale / row_sum[t];
  const int id = owned_row(targets[t], v0, v_local);
  for (int v = threadIdx.x; v < v_local; v += blockDim.x) {
    // Rounded product, then the subtraction, as the CPU does in two statements: near p = 1 the
    // target entry is a small difference that a fused multiply-add would round differently.
    const float g = __fmul_rn(row[v], inv);
    row[v] = v == id ? g - scale : g;
  }
}

}  // namespace

void embedding_forward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* table,
                       float* out) {
  if (tokens <= 0 || hidden <= 0) return;
  const std::size_t n = static_cast<std::size_t>(tokens) * hidden;
  embedding_forward_kernel<<<detail::blocks_for(n, 256), 256>>>(hidden, n, v0, v_local, ids, table, out);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void embedding_backward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* grad_out,
                        float* table_grad) {
  if (tokens <= 0 || hidden <= 0) return;
  const std::size_t n = static_cast<std::size_t>(tokens) * hidden;
  embedding_backward_kernel<<<detail::blocks_for(n, 256), 256>>>(hidden, n, v0, v_local, ids, grad_out, table_grad);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void ce_max_and_target(int tokens, int v_local, int v0, const float* logits, const std::int32_t* targets,
                       float* row_max, float* target_logit) {
  if (tokens <= 0) return;
  ce_max_and_target_kernel<<<tokens, detail::row_threads(v_local, 1024)>>>(v_local, v0, logits, targets, row_max,
                                                                          target_logit);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void ce_exp_and_sum(int tokens, int v_local, const float* row_max, float* logits, float* row_sum) {
  if (tokens <= 0) return;
  ce_exp_and_sum_kernel<<<tokens, detail::row_threads(v_local, 1024)>>>(v_local, row_max, logits, row_sum);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void ce_gradient(int tokens, int v_local, int v0, const std::int32_t* targets, const float* row_sum, float scale,
                 float* logits) {
  if (tokens <= 0 || v_local <= 0) return;
  ce_gradient_kernel<<<tokens, detail::row_threads(v_local, 1024)>>>(v_local, v0, targets, row_sum, scale, logits);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
