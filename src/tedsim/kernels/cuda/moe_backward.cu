// Backward of the MoE routing path on the device, with the semantics of cpu/dispatch.cpp
// (dispatch_backward, combine_backward) and cpu/gating_backward.cpp (the references); the
// gating arrays are DeviceGating's [T,k] expert / position / weight.
#include <cfloat>

#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

__device__ __forceinline__ std::size_t slot_offset(int expert, int position, int capacity, int hidden) {
  return (static_cast<std::size_t>(expert) * capacity + position) * hidden;
}

// One block per (token, choice): the weighted row into the slot and the dot product for the
// weight's gradient. Slots no kept choice points at stay as zero-filled before the launch.
__global__ void combine_backward_kernel(int k, int capacity, int hidden, const int* expert, const int* position,
                                        const float* weight, const float* buf, const float* grad_out,
                                        float* grad_buf, float* grad_weight) {
  __shared__ float scratch[32];
  const std::size_t i = blockIdx.x;
  const int pos = position[i];
  if (pos < 0) {
    if (threadIdx.x == 0) grad_weight[i] = 0.0f;
    return;  // uniform over the block: no thread reaches the reduction below
  }
  const std::size_t t = i / k;
  const std::size_t off = slot_offset(expert[i], pos, capacity, hidden);
  const float* go = grad_out + t * hidden;
  const float w = weight[i];
  float dot = 0.0f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    grad_buf[off + c] = w * go[c];
    dot += go[c] * buf[off + c];
  }
  dot = detail::block_sum(dot, scratch);
  if (threadIdx.x == 0) grad_weight[i] = dot;
}

// One warp per token, lanes over the experts. dp[e] = aux term + weight term (a token's choices
// are distinct experts, so each e gets at most one weight term), then the softmax Jacobian:
// grad_logit = p * (dp - <dp, p>). The per-token sums over the k choices are recomputed by every
// lane in choice order, matching the CPU's rounding.
__global__ void gating_backward_kernel(int tokens, int aux_tokens, int experts, int k, const float* probs,
                                       const int* expert, const int* position, const int* top1_count,
                                       const float* grad_weight, float grad_aux, float* grad_logits) {
  const int lane = threadIdx.x % 32;
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= tokens) return;  // whole warps leave together
  const float* p = probs + static_cast<std::size_t>(t) * experts;
  const float* g = grad_weight + static_cast<std::size_t>(t) * k;
  const int* ex = expert + static_cast<std::size_t>(t) * k;
  const int* pos = position + static_cast<std::size_t>(t) * k;

  float s = 0.0f, gp = 0.0f;
  if (k >= 2) {
    for (int j = 0; j < k; ++j) {
      if (pos[j] < 0) continue;
      s += p[ex[j]];
      gp += g[j] * p[ex[j]];
    }
  }
  const bool clamped = s < FLT_EPSILON;
  const float denom = clamped ? FLT_EPSILON : s;

  // dp for this lane's experts, kept in a second pass rather than an array: E can be large.
  auto dp_of = [&](int e) {
    // Same operation order as the CPU (double, then rounded to float) so the aux term is exact.
    const double ce = static_cast<double>(top1_count[e]) / aux_tokens;
    float dp = static_cast<float>(static_cast<double>(grad_aux) * experts * ce / aux_tokens);
    for (int j = 0; j < k; ++j) {
      if (pos[j] < 0 || ex[j] != e) continue;
      if (k == 1)
        dp += g[j];
      else
        dp += g[j] / denom - (clamped ? 0.0f : gp / (denom * denom));
    }
    return dp;
  };

  float dot = 0.0f;
  for (int e = lane; e < experts; e += 32) dot += dp_of(e) * p[e];
  dot = detail::warp_reduce(dot, detail::SumOp{});
  float* gl = grad_logits + static_cast<std::size_t>(t) * experts;
  for (int e = lane; e < experts; e += 32) gl[e] = p[e] * (dp_of(e) - dot);
}

}  // namespace

void dispatch_backward(int tokens, int k, int experts, int capacity, int hidden, const int* expert,
                       const int* position, const float* grad_buf, float* grad_x) {
  // Dispatch is an unweighted gather, so its backward is combine with every weight 1.
  combine(Dtype::fp32, tokens, k, experts, capacity, hidden, expert, position, nullptr, grad_buf, grad_x);
}

void combine_backward(int tokens, int k, int experts, int capacity, int hidden, const int* expert,
                      const int* position, const float* weight, const float* buf, const float* grad_out,
                      float* grad_buf, float* grad_weight) {
  // The CPU zeroes only the slots past each expert's kept count; without the counts here the
  // whole buffer is zeroed and the kept slots are then overwritten (same result).
  const std::size_t buf_bytes = static_cast<std::size_t>(experts) * capacity * hidden * sizeof(float);
  if (buf_bytes > 0) TEDSIM_CUDA_CHECK(cudaMemsetAsync(grad_buf, 0, buf_bytes));
  const std::size_t choices = static_cast<std::size_t>(tokens) * k;
  if (choices == 0) return;
  combine_backward_kernel<<<static_cast<unsigned>(choices), detail::row_threads(hidden, 256)>>>(
      k, capacity, hidden, expert, position, weight, buf, grad_out, grad_buf, grad_weight);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void gating_backward(const DeviceGating& fwd, const float* grad_weight, float grad_aux, float* grad_logits) {
  if (fwd.tokens <= 0 || fwd.experts <= 0) return;
  constexpr int kTokensPerBlock = 8;
  const unsigned blocks = (fwd.tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  const int aux_tokens = fwd.aux_tokens > 0 ? fwd.aux_tokens : fwd.tokens;
  gating_backward_kernel<<<blocks, 32 * kTokensPerBlock>>>(fwd.tokens, aux_tokens, fwd.experts, fwd.k, fwd.probs.as<float>(),
                                                          fwd.expert.as<int>(), fwd.position.as<int>(),
                                                          fwd.top1_count.as<int>(), grad_weight, grad_aux, grad_logits);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
