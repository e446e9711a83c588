// Attention core forward, fp32: one block per (head, query row). The score row lives in shared
// memory (seq floats), so the kernel is simple and exact rather than fast; calibration times the
// cuBLAS GEMMs for the score/context products, this kernel is the checked reference path.
#include <cmath>

#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/launch_limits.cuh"

namespace tedsim::kernels::cuda {

namespace {
__device__ float block_reduce(float v, float* scratch, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  return v;
}

__global__ void attention_row_kernel(int seq, int d, bool causal, float scale, const float* q, const float* k,
                                     const float* v, float* out) {
  extern __shared__ float scores[];
  __shared__ float scratch[32];
  const int i = blockIdx.x;         // query row
  const std::size_t head = blockIdx.y;
  const std::size_t off = head * seq * d;
  const int valid = causal ? i + 1 : seq;
  const float* qi = q + off + static_cast<std::size_t>(i) * d;
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) {
    const float* kj = k + off + static_cast<std::size_t>(j) * d;
    float acc = 0.0f;
    for (int c = 0; c < d; ++c) acc += qi[c] * kj[c];
    scores[j] = acc * scale;
    local_max = fmaxf(local_max, scores[j]);
  }
  const float m = block_reduce(local_max, scratch, true);
  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) local_sum += (scores[j] = __expf(scores[j] - m));
  const float inv = 1.0f / block_reduce(local_sum, scratch, false);
  __syncthreads();  // all scores written before any thread reads other threads' entries
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < valid; ++j) acc += scores[j] * v[off + static_cast<std::size_t>(j) * d + c];
    out[off + static_cast<std::size_t>(i) * d + c] = acc * inv;
  }
}
}  // namespace

void attention_forward(int heads, int seq, int head_dim, bool causal, const float* q, const float* k, const float* v,
                       float* out) {
  if (heads <= 0 || seq <= 0) return;
  detail::check_heads(heads, "cuda::attention_forward");
  const std::size_t shared = static_cast<std::size_t>(seq) * sizeof(float);
  detail::allow_shared_row(attention_row_kernel, shared, "cuda::attention_forward");
  const dim3 grid(seq, heads);
  attention_row_kernel<<<grid, 128, shared>>>(seq, head_dim, causal, 1.0f / std::sqrt(static_cast<float>(head_dim)), q,
                                              k, v, out);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
