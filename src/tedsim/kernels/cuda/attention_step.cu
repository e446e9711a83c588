// Attention core of the training step, fp32: queries and keys [heads, s, dk], values and outputs
// [heads, s, dv] (MLA's value heads differ from its query/key heads), the probabilities
// [heads, s, s] saved by the forward pass (as cpu/attention.cpp, the reference). Each block owns one row of
// one head and keeps that row (scores, or the dS row / column) in shared memory; dot products of
// two d-vectors are done by one warp so the rows of K, V, dO are read coalesced.
//
// Backward without atomics, so the gradients are deterministic and simply overwritten:
//  1. per query row i: dP_ij = dO_i . V_j, D_i = sum_j P_ij dP_ij, dS_ij = P_ij (dP_ij - D_i),
//     dQ_i = scale * sum_j dS_ij K_j; D_i is kept in a small stream-ordered scratch buffer;
//  2. per key row j: dP_ij again (dv flops each), dS_ij from the saved D_i, then
//     dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i dS_ij Q_i.
// Entries with P_ij == 0 (the causal mask) have dS_ij == 0 and are skipped in every loop.
#include <cmath>
#include <cstdint>
#include <string>

#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/launch_limits.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// a (shared) . b (global), both d floats; every lane of the warp gets the result.
__device__ __forceinline__ float warp_dot(const float* a, const float* b, int d) {
  const int lane = threadIdx.x % 32;
  float acc = 0.0f;
  for (int c = lane; c < d; c += 32) acc += a[c] * b[c];
  return detail::warp_reduce(acc, detail::SumOp{});
}

__global__ void forward_saving_probs_kernel(int seq, int d, int dv, bool causal, float scale, const float* q,
                                            const float* k, const float* v, float* probs, float* out) {
  extern __shared__ float shared[];
  float* qi = shared;       // [d]
  float* row = shared + d;  // [seq] scores, then probabilities
  __shared__ float scratch[32];
  const int i = blockIdx.x;
  const std::size_t head = blockIdx.y;
  const std::size_t off = head * seq * d, off_v = head * seq * dv;
  const int valid = causal ? i + 1 : seq;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  for (int c = threadIdx.x; c < d; c += blockDim.x) qi[c] = q[off + static_cast<std::size_t>(i) * d + c];
  __syncthreads();
  for (int j = warp; j < valid; j += warps) {
    const float s = warp_dot(qi, k + off + static_cast<std::size_t>(j) * d, d) * scale;
    if (lane == 0) row[j] = s;
  }
  __syncthreads();
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) local_max = fmaxf(local_max, row[j]);
  const float m = detail::block_max(local_max, scratch);
  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) local_sum += (row[j] = expf(row[j] - m));
  const float inv = 1.0f / detail::block_sum(local_sum, scratch);
  float* prow = probs + head * seq * seq + static_cast<std::size_t>(i) * seq;
  for (int j = threadIdx.x; j < seq; j += blockDim.x) {
    const float p = j < valid ? row[j] * inv : 0.0f;
    if (j < valid) row[j] = p;
    prow[j] = p;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < valid; ++j) acc += row[j] * v[off_v + static_cast<std::size_t>(j) * dv + c];
    out[off_v + static_cast<std::size_t>(i) * dv + c] = acc;
  }
}

__global__ void backward_query_rows_kernel(int seq, int d, int dv, float scale, const float* k, const float* v,
                                           const float* probs, const float* grad_out, float* grad_q, float* row_dot) {
  extern __shared__ float shared[];
  float* go = shared;       // [dv] dO_i
  float* ds = shared + dv;  // [seq] dP row, then dS row
  __shared__ float scratch[32];
  const int i = blockIdx.x;
  const std::size_t head = blockIdx.y;
  const std::size_t off = head * seq * d, off_v = head * seq * dv;
  const float* prow = probs + head * seq * seq + static_cast<std::size_t>(i) * seq;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  for (int c = threadIdx.x; c < dv; c += blockDim.x) go[c] = grad_out[off_v + static_cast<std::size_t>(i) * dv + c];
  __syncthreads();
  float local = 0.0f;  // only lane 0 of each warp accumulates, the block sum adds the warps
  for (int j = warp; j < seq; j += warps) {
    const float p = prow[j];
    const float dp = p != 0.0f ? warp_dot(go, v + off_v + static_cast<std::size_t>(j) * dv, dv) : 0.0f;
    if (lane == 0) {
      ds[j] = dp;
      local += dp * p;
    }
  }
  const float dot = detail::block_sum(local, scratch);  // its barriers publish ds[] too
  for (int j = threadIdx.x; j < seq; j += blockDim.x) ds[j] = prow[j] * (ds[j] - dot);
  if (threadIdx.x == 0) row_dot[head * seq + i] = dot;
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < seq; ++j) {
      const float s = ds[j];
      if (s != 0.0f) acc += s * k[off + static_cast<std::size_t>(j) * d + c];
    }
    grad_q[off + static_cast<std::size_t>(i) * d + c] = scale * acc;
  }
}

__global__ void backward_key_rows_kernel(int seq, int d, int dv, float scale, const float* q, const float* v,
                                         const float* probs, const float* grad_out, const float* row_dot,
                                         float* grad_k, float* grad_v) {
  extern __shared__ float shared[];
  float* vj = shared;                // [dv] V_j
  float* pcol = shared + dv;         // [seq] P_ij over i
  float* dscol = shared + dv + seq;  // [seq] dS_ij over i
  const int j = blockIdx.x;
  const std::size_t head = blockIdx.y;
  const std::size_t off = head * seq * d, off_v = head * seq * dv;
  const float* p_head = probs + head * seq * seq;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  for (int c = threadIdx.x; c < dv; c += blockDim.x) vj[c] = v[off_v + static_cast<std::size_t>(j) * dv + c];
  __syncthreads();
  for (int i = warp; i < seq; i += warps) {
    const float p = p_head[static_cast<std::size_t>(i) * seq + j];
    float s = 0.0f;
    if (p != 0.0f) {
      const float dp = warp_dot(vj, grad_out + off_v + static_cast<std::size_t>(i) * dv, dv);
      s = p * (dp - row_dot[head * seq + i]);
    }
    if (lane == 0) {
      pcol[i] = p;
      dscol[i] = s;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < seq; ++i) {
      const float p = pcol[i];
      if (p != 0.0f) acc += p * grad_out[off_v + static_cast<std::size_t>(i) * dv + c];
    }
    grad_v[off_v + static_cast<std::size_t>(j) * dv + c] = acc;
  }
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < seq; ++i)
      if (pcol[i] != 0.0f) acc += dscol[i] * q[off + static_cast<std::size_t>(i) * d + c];
    grad_k[off + static_cast<std::size_t>(j) * d + c] = scale * acc;
  }
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

}  // namespace

void attention_forward_saving_probs(int heads, int seq, int head_dim, int v_dim, bool causal, const float* q,
                                    const float* k, const float* v, float* probs, float* out) {
  if (heads <= 0 || seq <= 0) return;
  detail::check_heads(heads, "cuda::attention_forward_saving_probs");
  const std::size_t shared = (static_cast<std::size_t>(seq) + head_dim) * sizeof(float);
  detail::allow_shared_row(forward_saving_probs_kernel, shared, "cuda::attention_forward_saving_probs");
  const dim3 grid(seq, heads);
  forward_saving_probs_kernel<<<grid, kThreads, shared>>>(seq, head_dim, v_dim, causal, softmax_scale(head_dim), q, k,
                                                          v, probs, out);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void attention_backward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k, const float* v,
                        const float* probs, const float* grad_out, float* grad_q, float* grad_k, float* grad_v) {
  if (heads <= 0 || seq <= 0) return;
  detail::check_heads(heads, "cuda::attention_backward");
  const std::size_t query_shared = (static_cast<std::size_t>(seq) + v_dim) * sizeof(float);
  const std::size_t key_shared = (2 * static_cast<std::size_t>(seq) + v_dim) * sizeof(float);
  detail::allow_shared_row(backward_query_rows_kernel, query_shared, "cuda::attention_backward");
  detail::allow_shared_row(backward_key_rows_kernel, key_shared, "cuda::attention_backward");
  keep_async_allocations();
  float* row_dot = nullptr;  // D_i per (head, query row), between the two kernels only
  TEDSIM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&row_dot),
                                    static_cast<std::size_t>(heads) * seq * sizeof(float), 0));
  const dim3 grid(seq, heads);
  const float scale = softmax_scale(head_dim);
  backward_query_rows_kernel<<<grid, kThreads, query_shared>>>(seq, head_dim, v_dim, scale, k, v, probs, grad_out,
                                                               grad_q, row_dot);
  const cudaError_t launch_q = cudaGetLastError();
  if (launch_q == cudaSuccess) {
    backward_key_rows_kernel<<<grid, kThreads, key_shared>>>(seq, head_dim, v_dim, scale, q, v, probs, grad_out,
                                                             row_dot, grad_k, grad_v);
  }
  const cudaError_t launch_k = launch_q == cudaSuccess ? cudaGetLastError() : launch_q;
  // Freed in stream order whether or not the launches worked, then the launch error is reported.
  TEDSIM_CUDA_CHECK(cudaFreeAsync(row_dot, 0));
  TEDSIM_CUDA_CHECK(launch_k);
}

}  // namespace tedsim::kernels::cuda
