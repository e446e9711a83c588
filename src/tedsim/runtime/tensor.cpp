// Host memory, the current memory space, and Tensor storage management.
#include "tedsim/runtime/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

namespace tedsim::runtime {

std::atomic<long long>& MemoryCounter::live() {
  static std::atomic<long long> v{0};
  return v;
}
std::atomic<long long>& MemoryCounter::peak() {
  static std::atomic<long long> v{0};
  return v;
}
void MemoryCounter::add(long long bytes) {
  const long long now = live().fetch_add(bytes) + bytes;
  long long p = peak().load();
  while (now > p && !peak().compare_exchange_weak(p, now)) {
  }
}
void MemoryCounter::sub(long long bytes) { live().fetch_sub(bytes); }
void MemoryCounter::reset_peak() { peak().store(live().load()); }

namespace {

class HostMemory final : public MemorySpace {
 public:
  // 64-byte alignment: whole cache lines and aligned AVX loads in the kernels.
  void* allocate(std::size_t bytes) override { return ::operator new(bytes, std::align_val_t(64)); }
  void deallocate(void* ptr) noexcept override { ::operator delete(ptr, std::align_val_t(64)); }
  void zero(void* ptr, std::size_t bytes) override { std::memset(ptr, 0, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memmove(dst, src, bytes); }
  void upload(void* dst, const void* host_src, std::size_t bytes) override { std::memcpy(dst, host_src, bytes); }
};

MemorySpace*& active_space() {
  static MemorySpace* space = &host_memory();
  return space;
}

}  // namespace

MemorySpace& host_memory() {
  static HostMemory space;
  return space;
}

MemorySpace& current_memory_space() { return *active_space(); }

ScopedMemorySpace::ScopedMemorySpace(MemorySpace& space) : saved_(active_space()) { active_space() = &space; }
ScopedMemorySpace::~ScopedMemorySpace() { active_space() = saved_; }

void Tensor::resize(std::size_t n) {
  if (n <= capacity_) {
    if (n > size_) space_->zero(ptr_ + size_, (n - size_) * sizeof(float));
    size_ = n;
    return;
  }
  MemorySpace& space = space_ ? *space_ : current_memory_space();
  auto* fresh = static_cast<float*>(space.allocate(n * sizeof(float)));
  MemoryCounter::add(static_cast<long long>(n * sizeof(float)));
  if (size_) space.copy(fresh, ptr_, size_ * sizeof(float));
  space.zero(fresh + size_, (n - size_) * sizeof(float));
  release_storage();
  space_ = &space;
  ptr_ = fresh;
  size_ = n;
  capacity_ = n;
}

void Tensor::fill_zero() {
  if (size_) space_->zero(ptr_, size_ * sizeof(float));
}

void Tensor::swap(Tensor& other) noexcept {
  std::swap(space_, other.space_);
  std::swap(ptr_, other.ptr_);
  std::swap(size_, other.size_);
  std::swap(capacity_, other.capacity_);
}

void Tensor::release_storage() noexcept {
  if (ptr_) {
    space_->deallocate(ptr_);
    MemoryCounter::sub(static_cast<long long>(capacity_ * sizeof(float)));
  }
  ptr_ = nullptr;
  size_ = capacity_ = 0;
}

float* zeros(Tensor& t, std::size_t n) {
  ensure(t, n);
  t.fill_zero();
  return t.data();
}

}  // namespace tedsim::runtime
