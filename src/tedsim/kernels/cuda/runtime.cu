// Device memory, synchronization and dtype conversion: the plumbing tests and benchmarks need to
// drive the kernels from plain C++.
#include <algorithm>
#include <cstdint>

#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky, but would make the next launch check blame another kernel
    detail::fail(__FILE__, __LINE__, "cudaMalloc of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(err));
  }
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throw from a destructor
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) detail::fail(__FILE__, __LINE__, "upload larger than the device buffer");
  if (bytes) TEDSIM_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
}
void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) detail::fail(__FILE__, __LINE__, "download larger than the device buffer");
  if (bytes) TEDSIM_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost));
}
void DeviceBuffer::zero() {
  if (bytes_) TEDSIM_CUDA_CHECK(cudaMemset(ptr_, 0, bytes_));
}

void synchronize() { TEDSIM_CUDA_CHECK(cudaDeviceSynchronize()); }

namespace {
template <class Src, class Dst>
__global__ void convert_kernel(const Src* src, Dst* dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = detail::from_f32<Dst>(detail::to_f32(src[i]));
  }
}
}  // namespace

void convert_from_fp32(const float* src, Dtype dst_type, void* dst, std::size_t n) {
  detail::with_type(dst_type, [&](auto tag) {
    using T = decltype(tag);
    convert_kernel<float, T><<<detail::blocks_for(n, 256), 256>>>(src, static_cast<T*>(dst), n);
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void convert_to_fp32(const void* src, Dtype src_type, float* dst, std::size_t n) {
  detail::with_type(src_type, [&](auto tag) {
    using T = decltype(tag);
    convert_kernel<T, float><<<detail::blocks_for(n, 256), 256>>>(static_cast<const T*>(src), dst, n);
  });
  TEDSIM_CUDA_CHECK_LAUNCH();
}

namespace {
// A 2D grid, columns on x and rows on y, each stepping by its grid: no per-element division (a
// 64-bit one is a long software sequence on the GPU and would make this copy compute-bound).
__global__ void rows_to_bf16_kernel(int rows, int cols, const float* src, std::size_t ld, __nv_bfloat16* dst) {
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* in = src + static_cast<std::size_t>(r) * ld;
    __nv_bfloat16* out = dst + static_cast<std::size_t>(r) * cols;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
      out[c] = __float2bfloat16_rn(in[c]);
  }
}

// The same four columns at a time: one 16-byte load and one 8-byte store per thread, which a
// bandwidth-bound copy needs to come near the memory's speed (scalar 4-byte loads reached about
// a third of an H200's, reports/device/ run 4). __floats2bfloat162_rn rounds as __float2bfloat16_rn.
__global__ void rows_to_bf16_x4_kernel(int rows, int cols4, const float4* src, std::size_t ld4, uint2* dst) {
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const float4* in = src + static_cast<std::size_t>(r) * ld4;
    uint2* out = dst + static_cast<std::size_t>(r) * cols4;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols4; c += gridDim.x * blockDim.x) {
      const float4 v = in[c];
      union {
        __nv_bfloat162 halves[2];
        uint2 bits;
      } packed;
      packed.halves[0] = __floats2bfloat162_rn(v.x, v.y);
      packed.halves[1] = __floats2bfloat162_rn(v.z, v.w);
      out[c] = packed.bits;
    }
  }
}
}  // namespace

void convert_rows_to_bf16(int rows, int cols, const float* src, int ld, void* dst) {
  if (rows <= 0 || cols <= 0) return;
  const unsigned threads = 256;
  const unsigned row_blocks = static_cast<unsigned>(std::min(rows, 65535));
  const bool by_four = cols % 4 == 0 && ld % 4 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(dst) % 8 == 0;
  if (by_four) {
    const int cols4 = cols / 4;
    const unsigned col_blocks = static_cast<unsigned>(std::min((cols4 + threads - 1) / threads, 64u));
    rows_to_bf16_x4_kernel<<<dim3(col_blocks, row_blocks), threads>>>(
        rows, cols4, reinterpret_cast<const float4*>(src), static_cast<std::size_t>(ld / 4), static_cast<uint2*>(dst));
  } else {
    const unsigned col_blocks = static_cast<unsigned>(std::min((cols + threads - 1) / threads, 64u));
    rows_to_bf16_kernel<<<dim3(col_blocks, row_blocks), threads>>>(rows, cols, src, static_cast<std::size_t>(ld),
                                                                   static_cast<__nv_bfloat16*>(dst));
  }
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
