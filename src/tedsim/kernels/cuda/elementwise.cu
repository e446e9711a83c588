// Memory-bound kernels: LayerNorm (one block per row), GeLU, SwiGLU, Adam. Storage in T, math in
// fp32, same formulas as the CPU versions in cpu/ (which are the references).
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {
using detail::from_f32;
using detail::to_f32;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;

// Sum over the block; blockDim.x is a multiple of 32 and at most 1024.
__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__global__ void layernorm_kernel(int hidden, float eps, const T* x, const float* gamma, const float* beta, T* y,
                                 float* mean, float* rstd) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const T* xr = x + row * hidden;
  T* yr = y + row * hidden;
  float s = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) s += to_f32(xr[i]);
  const float mu = block_sum(s, shared) / hidden;
  float v = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float d = to_f32(xr[i]) - mu;
    v += d * d;
  }
  const float rs = rsqrtf(block_sum(v, shared) / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    yr[i] = from_f32<T>((to_f32(xr[i]) - mu) * rs * gamma[i] + beta[i]);
  }
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

template <class T>
__global__ void gelu_kernel(std::size_t n, const T* x, T* y) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = to_f32(x[i]);
    y[i] = from_f32<T>(0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v))));
  }
}

template <class T>
__global__ void gelu_backward_kernel(std::size_t n, const T* x, const T* gy, T* gx) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = to_f32(x[i]);
    const float th = tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
    gx[i] = from_f32<T>(to_f32(gy[i]) * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du));
  }
}

template <class T>
__global__ void swiglu_kernel(int rows, int ffn, const T* x, T* y) {
  const std::size_t n = static_cast<std::size_t>(rows) * ffn;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / ffn, c = i % ffn;
    const float a = to_f32(x[r * 2 * ffn + c]), b = to_f32(x[r * 2 * ffn + ffn + c]);
    y[i] = from_f32<T>(a / (1.0f + __expf(-a)) * b);
  }
}

__global__ void adam_kernel(std::size_t n, float lr, float b1, float b2, float eps, float wd, bool adamw,
                            float step_size, float inv_sqrt_bc2, float* p, const float* g, float* m, float* v) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float grad = g[i];
    const float pi = p[i];
    if (!adamw) grad += wd * pi;
    const float mi = b1 * m[i] + (1.0f - b1) * grad;
    const float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    float update = step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    if (adamw) update += lr * wd * pi;
    p[i] = pi - update;
  }
}
}  // namespace

void layernorm_forward(Dtype type, int rows, int hidden, float eps, const void* x, const float* gamma,
                       const float* beta, void* y, float* mean, float* rstd) {
  if (rows <= 0) return;
  if (hidden <= 0) throw InputError("cuda::layernorm_forward: hidden must be positive, got " + std::to_string(hidden));
  const int threads = hidden >= 1024 ? 1024 : ((hidden + 31) / 32) * 32;
  detail::with_type(type, [&](auto tag) {
    using T = decltype(tag);
    layernorm_kernel<T><<<rows, threads>>>(hidden, eps, static_cast<const T*>(x), gamma, beta, static_cast<T*>(y),
                                           mean, rstd);
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void gelu_forward(Dtype type, std::size_t n, const void* x, void* y) {
  detail::with_type(type, [&](auto tag) {
    using T = decltype(tag);
    gelu_kernel<T><<<detail::blocks_for(n, 256), 256>>>(n, static_cast<const T*>(x), static_cast<T*>(y));
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void gelu_backward(Dtype type, std::size_t n, const void* x, const void* grad_y, void* grad_x) {
  detail::with_type(type, [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<T><<<detail::blocks_for(n, 256), 256>>>(n, static_cast<const T*>(x),
                                                                 static_cast<const T*>(grad_y), static_cast<T*>(grad_x));
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void swiglu_forward(Dtype type, int rows, int ffn, const void* x, void* y) {
  const std::size_t n = static_cast<std::size_t>(rows) * ffn;
  detail::with_type(type, [&](auto tag) {
    using T = decltype(tag);
    swiglu_kernel<T><<<detail::blocks_for(n, 256), 256>>>(rows, ffn, static_cast<const T*>(x), static_cast<T*>(y));
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void adam_step(std::size_t n, const AdamConfig& cfg, int step, float* params, const float* grads, float* exp_avg,
               float* exp_avg_sq) {
  if (step < 1) throw InputError("cuda::adam_step: step is 1-based, got " + std::to_string(step));
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(cfg.beta1), step));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(cfg.beta2), step));
  adam_kernel<<<detail::blocks_for(n, 256), 256>>>(n, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
                                                   cfg.adamw, cfg.lr / bc1, 1.0f / std::sqrt(bc2), params, grads,
                                                   exp_avg, exp_avg_sq);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
