#pragma once
// Tensors of the training step. A Tensor is a flat fp32 buffer in one memory space: host memory
// for the CPU backend, device memory for the CUDA backend. The trainer never touches tensor
// elements itself; it hands data() pointers to its StepOps (step_ops.hpp), so the same step code
// runs on either backend.
//
// Every buffer the step allocates is counted by MemoryCounter, so the measured memory of a rank
// is the live/peak byte count of the step's own tensors (parameters, gradients, optimizer state,
// activations, communication buffers), not the process RSS (which also holds MPI's shared-memory
// segments, the CUDA context and the binary).
#include <atomic>
#include <cstddef>

namespace tedsim::runtime {

struct MemoryCounter {
  static std::atomic<long long>& live();
  static std::atomic<long long>& peak();
  static void add(long long bytes);
  static void sub(long long bytes);
  static void reset_peak();
};

// Where tensors live. Implementations: host memory (tensor.cpp) and CUDA device memory
// (step_ops_cuda.cpp).
class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) noexcept = 0;
  virtual void zero(void* ptr, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;  // within the space
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
};

MemorySpace& host_memory();

// The space new tensors allocate from: host memory unless a ScopedMemorySpace is alive. A device
// Trainer installs its space for its lifetime (one trainer per process at a time).
MemorySpace& current_memory_space();
class ScopedMemorySpace {
 public:
  explicit ScopedMemorySpace(MemorySpace& space);
  ~ScopedMemorySpace();
  ScopedMemorySpace(const ScopedMemorySpace&) = delete;
  ScopedMemorySpace& operator=(const ScopedMemorySpace&) = delete;

 private:
  MemorySpace* saved_;
};

class Tensor {
 public:
  Tensor() = default;
  ~Tensor() { release_storage(); }
  Tensor(Tensor&& other) noexcept { swap(other); }
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      release_storage();
      swap(other);
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  float* data() { return ptr_; }
  const float* data() const { return ptr_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // std::vector's semantics: keeps the first min(old, n) elements, zero-fills the rest, never
  // shrinks the allocation (buffers reused across micro-batches are allocated once).
  void resize(std::size_t n);
  void fill_zero();
  void swap(Tensor& other) noexcept;

 private:
  void release_storage() noexcept;
  MemorySpace* space_ = nullptr;  // the space ptr_ came from
  float* ptr_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
};

// Resizes without promising contents.
inline float* ensure(Tensor& t, std::size_t n) {
  if (t.size() != n) t.resize(n);
  return t.data();
}
float* zeros(Tensor& t, std::size_t n);
// Releases the storage (checkpointed activations between forward and backward).
inline void release(Tensor& t) { Tensor().swap(t); }

}  // namespace tedsim::runtime
