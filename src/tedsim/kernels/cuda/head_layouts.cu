// Layout moves of the attention heads, the device versions of the trainer's split_heads,
// merge_heads_grad, heads_to_tokens and tokens_to_heads (runtime/layers/attention.cpp). One thread
// per destination element, so every output is written exactly once: merge_heads_grad sums the
// repeated kv heads in a register (in head order, as the CPU does) instead of accumulating
// into a zeroed buffer with atomics.
//
// Shapes: token-major rows [b*s, width] and head-major [b*heads, s, hd]; q_w = heads*hd,
// kv_w = kv_heads*hd, the fused qkv row is [q | k | v] of width q_w + 2*kv_w, and query head hi
// reads kv head hi / (heads / kv_heads).
#include <string>

#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

// Offset of (sequence bi, head hi, position p) in a head-major [b*heads, s, hd] tensor.
__device__ __forceinline__ std::size_t head_major(int bi, int hi, int p, int heads, int s, int hd) {
  return ((static_cast<std::size_t>(bi) * heads + hi) * s + p) * hd;
}

__global__ void split_heads_kernel(int s, int heads, int grp, int hd, std::size_t n, const float* qkv, float* q,
                                   float* k, float* v) {
  const int q_w = heads * hd, kv_w = heads / grp * hd;
  const std::size_t qkv_w = static_cast<std::size_t>(q_w) + 2 * kv_w;
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) {
    // i walks the head-major outputs: ((bi * heads + hi) * s + p) * hd + c.
    const int c = static_cast<int>(i % hd);
    const std::size_t row = i / hd;
    const int p = static_cast<int>(row % s);
    const std::size_t bh = row / s;
    const int hi = static_cast<int>(bh % heads);
    const std::size_t bi = bh / heads;
    const float* src = qkv + (bi * s + p) * qkv_w;
    const int j = hi / grp;
    q[i] = src[hi * hd + c];
    k[i] = src[q_w + j * hd + c];
    v[i] = src[q_w + kv_w + j * hd + c];
  }
}

__global__ void merge_heads_grad_kernel(int s, int heads, int grp, int hd, std::size_t n, const float* gq,
                                        const float* gk, const float* gv, float* gqkv) {
  const int q_w = heads * hd, kv_w = heads / grp * hd;
  const std::size_t qkv_w = static_cast<std::size_t>(q_w) + 2 * kv_w;
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) {
    // i walks the token-major output: (bi * s + p) * qkv_w + col.
    const int col = static_cast<int>(i % qkv_w);
    const std::size_t tok = i / qkv_w;
    const int p = static_cast<int>(tok % s);
    const int bi = static_cast<int>(tok / s);
    if (col < q_w) {
      gqkv[i] = gq[head_major(bi, col / hd, p, heads, s, hd) + col % hd];
      continue;
    }
    const bool is_k = col < q_w + kv_w;
    const int kv_col = is_k ? col - q_w : col - q_w - kv_w;
    const int j = kv_col / hd, c = kv_col % hd;
    const float* g = is_k ? gk : gv;
    float acc = 0.0f;
    for (int hi = j * grp; hi < (j + 1) * grp; ++hi) acc += g[head_major(bi, hi, p, heads, s, hd) + c];
    gqkv[i] = acc;
  }
}

// to_tokens: head-major src -> token-major dst; otherwise the reverse. i walks the token-major
// side either way (so the wide rows are the coalesced ones).
__global__ void heads_tokens_kernel(int s, int heads, int hd, std::size_t n, bool to_tokens, const float* src,
                                    float* dst) {
  const std::size_t width = static_cast<std::size_t>(heads) * hd;
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) {
    const int col = static_cast<int>(i % width);
    const std::size_t tok = i / width;
    const int p = static_cast<int>(tok % s);
    const int bi = static_cast<int>(tok / s);
    const std::size_t h = head_major(bi, col / hd, p, heads, s, hd) + col % hd;
    if (to_tokens)
      dst[i] = src[h];
    else
      dst[h] = src[i];
  }
}

void check_heads(int heads, int kv_heads, const char* what) {
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    throw InputError(std::string(what) + ": heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" +
                     std::to_string(kv_heads) + ")");
  }
}

std::size_t count(int b, int s, long long width) {
  if (b <= 0 || s <= 0 || width <= 0) return 0;
  return static_cast<std::size_t>(b) * s * static_cast<std::size_t>(width);
}

}  // namespace

void split_heads(int b, int s, int heads, int kv_heads, int hd, const float* qkv, float* q, float* k, float* v) {
  check_heads(heads, kv_heads, "cuda::split_heads");
  const std::size_t n = count(b, s, static_cast<long long>(heads) * hd);
  if (n == 0) return;
  split_heads_kernel<<<detail::blocks_for(n, 256), 256>>>(s, heads, heads / kv_heads, hd, n, qkv, q, k, v);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void merge_heads_grad(int b, int s, int heads, int kv_heads, int hd, const float* grad_q, const float* grad_k,
                      const float* grad_v, float* grad_qkv) {
  check_heads(heads, kv_heads, "cuda::merge_heads_grad");
  const std::size_t n = count(b, s, (static_cast<long long>(heads) + 2LL * kv_heads) * hd);
  if (n == 0) return;
  merge_heads_grad_kernel<<<detail::blocks_for(n, 256), 256>>>(s, heads, heads / kv_heads, hd, n, grad_q, grad_k,
                                                               grad_v, grad_qkv);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void heads_to_tokens(int b, int s, int heads, int hd, const float* src, float* dst) {
  const std::size_t n = count(b, s, static_cast<long long>(heads) * hd);
  if (n == 0) return;
  heads_tokens_kernel<<<detail::blocks_for(n, 256), 256>>>(s, heads, hd, n, true, src, dst);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void tokens_to_heads(int b, int s, int heads, int hd, const float* src, float* dst) {
  const std::size_t n = count(b, s, static_cast<long long>(heads) * hd);
  if (n == 0) return;
  heads_tokens_kernel<<<detail::blocks_for(n, 256), 256>>>(s, heads, hd, n, false, src, dst);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
