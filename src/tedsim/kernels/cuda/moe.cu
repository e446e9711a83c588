// MoE routing on the device with the CPU gating's semantics (cpu/gating.hpp):
//  1. per token (one thread): top-k on logits (ties to lowest index), softmax, top-1 counts;
//  2. per expert (one block): column sum of probs (for the aux loss);
//  3. per expert (one block): positions = ordered prefix count over the j-major choice sequence
//     (all j-th choices before (j+1)-th, token order inside), so the result equals the CPU's;
//  4. per token: combine weights; 5. one thread: aux loss.
// Dispatch copies rows into zeroed [E,C,h]; combine accumulates weighted rows in fp32.
#include <cfloat>

#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/routing_common.hpp"

namespace tedsim::kernels::cuda {

namespace {
using detail::from_f32;
using detail::to_f32;

__global__ void topk_softmax_kernel(const float* logits, int tokens, int experts, int k, float* probs, int* expert,
                                    int* top1_count) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* x = logits + static_cast<std::size_t>(t) * experts;
  float best_v[kMaxTopK];
  int best_i[kMaxTopK];
  int filled = 0;
  for (int e = 0; e < experts; ++e) {
    const float v = x[e];
    if (filled == k && !(v > best_v[k - 1])) continue;
    int slot = filled < k ? filled++ : k - 1;
    while (slot > 0 && v > best_v[slot - 1]) {
      best_v[slot] = best_v[slot - 1];
      best_i[slot] = best_i[slot - 1];
      --slot;
    }
    best_v[slot] = v;
    best_i[slot] = e;
  }
  for (int j = 0; j < k; ++j) expert[static_cast<std::size_t>(t) * k + j] = best_i[j];
  atomicAdd(&top1_count[best_i[0]], 1);
  const float m = best_v[0];
  float s = 0.0f;
  float* p = probs + static_cast<std::size_t>(t) * experts;
  for (int e = 0; e < experts; ++e) s += (p[e] = expf(x[e] - m));  // expf, not __expf: the CPU check allows 1e-5
  const float inv = 1.0f / s;
  for (int e = 0; e < experts; ++e) p[e] *= inv;
}

__global__ void column_sum_kernel(const float* probs, int tokens, int experts, float* prob_sum) {
  __shared__ float shared[1024];
  const int e = blockIdx.x;
  float s = 0.0f;
  for (int t = threadIdx.x; t < tokens; t += blockDim.x) s += probs[static_cast<std::size_t>(t) * experts + e];
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) shared[threadIdx.x] += shared[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) prob_sum[e] = shared[0];
}

// One block per expert, 1024 threads: chunks of 1024 choices are scanned with warp ballots.
__global__ void positions_kernel(const int* expert, int tokens, int k, int capacity, int* position, int* routed,
                                 int* kept) {
  __shared__ int warp_total[32];
  __shared__ int warp_offset[32];
  const int e = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long long total = static_cast<long long>(tokens) * k;
  int running = 0;
  for (long long base = 0; base < total; base += blockDim.x) {
    const long long idx = base + threadIdx.x;  // j-major: idx = j * T + t
    long long slot = -1;
    bool mine = false;
    if (idx < total) {
      const long long j = idx / tokens, t = idx % tokens;
      slot = t * k + j;
      mine = expert[slot] == e;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    const int before_in_warp = __popc(ballot & ((1u << lane) - 1u));
    if (lane == 0) warp_total[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
      int acc = 0;
      for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
        warp_offset[w] = acc;
        acc += warp_total[w];
      }
      warp_total[0] = acc;  // block total (read after the next barrier)
    }
    __syncthreads();
    if (mine) {
      const int pos = running + warp_offset[warp] + before_in_warp;
      position[slot] = pos < capacity ? pos : -1;
    }
    running += warp_total[0];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    routed[e] = running;
    kept[e] = running < capacity ? running : capacity;
  }
}

__global__ void weights_kernel(const float* probs, const int* expert, const int* position, int tokens, int experts,
                               int k, float* weight) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const std::size_t base = static_cast<std::size_t>(t) * k;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    const float w = position[base + j] >= 0 ? probs[static_cast<std::size_t>(t) * experts + expert[base + j]] : 0.0f;
    weight[base + j] = w;
    sum += w;
  }
  if (k >= 2) {
    const float inv = 1.0f / fmaxf(sum, FLT_EPSILON);
    for (int j = 0; j < k; ++j) weight[base + j] *= inv;
  }
}

__global__ void aux_kernel(const float* prob_sum, const int* top1_count, int tokens, int experts, float* aux) {
  double acc = 0.0;
  for (int e = 0; e < experts; ++e) {
    acc += (static_cast<double>(prob_sum[e]) / tokens) * (static_cast<double>(top1_count[e]) / tokens);
  }
  *aux = static_cast<float>(acc * experts);
}

template <class T>
__global__ void dispatch_kernel(int tokens, int k, int capacity, int hidden, const int* expert, const int* position,
                                const T* x, T* buf) {
  const std::size_t i = blockIdx.x;  // one block per (token, choice)
  const int pos = position[i];
  if (pos < 0) return;
  const std::size_t t = i / k;
  T* dst = buf + (static_cast<std::size_t>(expert[i]) * capacity + pos) * hidden;
  const T* src = x + t * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = src[c];
}

template <class T>
__global__ void combine_kernel(int k, int capacity, int hidden, const int* expert, const int* position,
                               const float* weight, const T* buf, T* out) {
  const std::size_t t = blockIdx.x;  // one block per token
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const std::size_t i = t * k + j;
      const int pos = position[i];
      if (pos < 0) continue;
      const float w = weight ? weight[i] : 1.0f;  // null: unweighted (dispatch_backward)
      acc += w * to_f32(buf[(static_cast<std::size_t>(expert[i]) * capacity + pos) * hidden + c]);
    }
    out[t * hidden + c] = from_f32<T>(acc);
  }
}
}  // namespace

void gating_forward(const float* logits, int tokens, int experts, const GatingConfig& cfg, DeviceGating& out) {
  if (tokens < 0 || experts <= 0 || cfg.k < 1 || cfg.k > kMaxTopK || cfg.k > experts) {
    throw InputError("cuda::gating_forward: need tokens >= 0, experts > 0, 1 <= k <= min(8, experts)");
  }
  const int k = cfg.k;
  const int cap = cfg.drop_tokens ? capacity(tokens, experts, k, cfg.capacity_factor, cfg.min_capacity)
                                  : (k * tokens > cfg.min_capacity ? k * tokens : cfg.min_capacity);
  const std::size_t tk = static_cast<std::size_t>(tokens) * k, te = static_cast<std::size_t>(tokens) * experts;
  // (Re)allocate only when the shape changes, so a timing loop measures the kernels alone.
  if (out.tokens != tokens || out.experts != experts || out.k != k || out.probs.bytes() == 0) {
    out.probs = DeviceBuffer(te * sizeof(float) + 4);
    out.expert = DeviceBuffer(tk * sizeof(int) + 4);
    out.position = DeviceBuffer(tk * sizeof(int) + 4);
    out.weight = DeviceBuffer(tk * sizeof(float) + 4);
    out.routed = DeviceBuffer(experts * sizeof(int));
    out.kept = DeviceBuffer(experts * sizeof(int));
    out.top1_count = DeviceBuffer(experts * sizeof(int));
    out.prob_sum = DeviceBuffer(experts * sizeof(float));
    out.aux_loss = DeviceBuffer(sizeof(float));
  }
  out.tokens = tokens;
  out.experts = experts;
  out.k = k;
  out.capacity = cap;
  out.aux_tokens = 0;
  TEDSIM_CUDA_CHECK(cudaMemsetAsync(out.top1_count.data(), 0, out.top1_count.bytes()));
  if (tokens > 0) {
    const unsigned blocks = (tokens + 127) / 128;
    topk_softmax_kernel<<<blocks, 128>>>(logits, tokens, experts, k, out.probs.as<float>(), out.expert.as<int>(),
                                         out.top1_count.as<int>());
    TEDSIM_CUDA_CHECK_LAUNCH();
  }
  detail::launch_choice_positions(out.expert.as<int>(), tokens, k, experts, cap, out.position.as<int>(),
                                  out.routed.as<int>(), out.kept.as<int>());
  if (tokens > 0) {
    weights_kernel<<<(tokens + 127) / 128, 128>>>(out.probs.as<float>(), out.expert.as<int>(), out.position.as<int>(),
                                                  tokens, experts, k, out.weight.as<float>());
    TEDSIM_CUDA_CHECK_LAUNCH();
  }
  detail::launch_balance_loss(out.probs.as<float>(), out.top1_count.as<int>(), tokens, experts,
                              out.prob_sum.as<float>(), out.aux_loss.as<float>());
}

namespace detail {

void launch_choice_positions(const int* expert, int tokens, int k, int experts, int capacity, int* position,
                             int* routed, int* kept) {
  positions_kernel<<<experts, 1024>>>(expert, tokens, k, capacity, position, routed, kept);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void launch_balance_loss(const float* probs, const int* top1_count, int tokens, int experts, float* prob_sum,
                         float* aux) {
  column_sum_kernel<<<experts, 1024>>>(probs, tokens, experts, prob_sum);
  TEDSIM_CUDA_CHECK_LAUNCH();
  if (tokens <= 0) return;
  aux_kernel<<<1, 1>>>(prob_sum, top1_count, tokens, experts, aux);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

void DeviceGating::download(GatingOutput& out) const {
  out.tokens = tokens;
  out.experts = experts;
  out.k = k;
  out.capacity = capacity;
  const std::size_t tk = static_cast<std::size_t>(tokens) * k, te = static_cast<std::size_t>(tokens) * experts;
  out.probs.resize(te);
  out.expert.resize(tk);
  out.position.resize(tk);
  out.weight.resize(tk);
  out.routed.resize(experts);
  out.kept.resize(experts);
  out.top1_count.resize(experts);
  synchronize();
  probs.download(out.probs.data(), te * sizeof(float));
  expert.download(out.expert.data(), tk * sizeof(int));
  position.download(out.position.data(), tk * sizeof(int));
  weight.download(out.weight.data(), tk * sizeof(float));
  routed.download(out.routed.data(), experts * sizeof(int));
  kept.download(out.kept.data(), experts * sizeof(int));
  top1_count.download(out.top1_count.data(), experts * sizeof(int));
  float aux = 0.0f;
  if (tokens > 0) aux_loss.download(&aux, sizeof aux);
  out.aux_loss = aux;
}

void dispatch(Dtype type, int tokens, int k, int experts, int capacity, int hidden, const int* expert,
              const int* position, const void* x, void* buf) {
  const std::size_t buf_bytes = static_cast<std::size_t>(experts) * capacity * hidden * bytes_of(type);
  TEDSIM_CUDA_CHECK(cudaMemsetAsync(buf, 0, buf_bytes));
  if (tokens == 0 || hidden <= 0) return;
  const int threads = hidden >= 256 ? 256 : ((hidden + 31) / 32) * 32;
  detail::with_type(type, [&](auto tag) {
    using T = decltype(tag);
    dispatch_kernel<T><<<static_cast<unsigned>(static_cast<std::size_t>(tokens) * k), threads>>>(
        tokens, k, capacity, hidden, expert, position, static_cast<const T*>(x), static_cast<T*>(buf));
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void combine(Dtype type, int tokens, int k, int /*experts*/, int capacity, int hidden, const int* expert,
             const int* position, const float* weight, const void* buf, void* out) {
  if (tokens == 0 || hidden <= 0) return;
  const int threads = hidden >= 256 ? 256 : ((hidden + 31) / 32) * 32;
  detail::with_type(type, [&](auto tag) {
    using T = decltype(tag);
    combine_kernel<T><<<tokens, threads>>>(k, capacity, hidden, expert, position, weight,
                                           static_cast<const T*>(buf), static_cast<T*>(out));
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
