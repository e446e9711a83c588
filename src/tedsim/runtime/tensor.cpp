// Host memory, the current memory space, and Tensor storage management.
#include "tedsim/runtime/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <new>
#include <unordered_map>
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

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // ASan must see every free to find a use after it
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Host memory with a size-keyed cache of freed blocks, as DeviceMemory (step_ops_cuda.cpp) and
// PyTorch's caching allocator keep them: the step frees and re-allocates the same sizes every
// micro-batch (CAC stashes, scratch), and without the cache each time pays the allocator and the
// first touch of fresh pages, a cost (7% of a checkpointed CAC step here) the frameworks tedsim
// models do not pay. Cached blocks are not live tensor memory (MemoryCounter), and the cache is
// bounded. Tensors are allocated and freed on one thread per process.
class HostMemory final : public MemorySpace {
 public:
  ~HostMemory() override {
    for (auto& [bytes, ptr] : cache_) release(ptr);
  }
  // 64-byte alignment: whole cache lines and aligned AVX loads in the kernels.
  void* allocate(std::size_t bytes) override {
    auto it = cache_.find(bytes);
    void* ptr = nullptr;
    if (it != cache_.end()) {
      ptr = it->second;
      cached_bytes_ -= bytes;
      cache_.erase(it);
    } else {
      ptr = ::operator new(bytes, std::align_val_t(64));
    }
    try {
      sizes_[ptr] = bytes;
    } catch (...) {
      release(ptr);
      throw;
    }
    return ptr;
  }
  void deallocate(void* ptr) noexcept override {
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) return release(ptr);
    const std::size_t bytes = it->second;
    sizes_.erase(it);
    if (kSanitized || cached_bytes_ + bytes > kCacheLimitBytes) return release(ptr);
    try {
      cache_.emplace(bytes, ptr);
      cached_bytes_ += bytes;
    } catch (...) {  // no memory for the cache entry: free the block instead
      release(ptr);
    }
  }
  void zero(void* ptr, std::size_t bytes) override { std::memset(ptr, 0, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memmove(dst, src, bytes); }
  void upload(void* dst, const void* host_src, std::size_t bytes) override { std::memcpy(dst, host_src, bytes); }

 private:
  static constexpr std::size_t kCacheLimitBytes = std::size_t(512) << 20;
  static void release(void* ptr) noexcept { ::operator delete(ptr, std::align_val_t(64)); }
  std::multimap<std::size_t, void*> cache_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::size_t cached_bytes_ = 0;
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
