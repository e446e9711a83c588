#pragma once
// Host tensors of the CPU training step. Every buffer the step allocates goes through
// TrackingAllocator, so the measured memory of a rank is the live/peak byte count of the step's own
// tensors (parameters, gradients, optimizer state, activations, communication buffers), not the
// process RSS (which also holds MPI's shared-memory segments and the binary).
#include <atomic>
#include <cstddef>
#include <cstring>
#include <new>
#include <vector>

namespace tedsim::runtime {

struct MemoryCounter {
  static std::atomic<long long>& live() {
    static std::atomic<long long> v{0};
    return v;
  }
  static std::atomic<long long>& peak() {
    static std::atomic<long long> v{0};
    return v;
  }
  static void add(long long bytes) {
    const long long now = live().fetch_add(bytes) + bytes;
    long long p = peak().load();
    while (now > p && !peak().compare_exchange_weak(p, now)) {
    }
  }
  static void sub(long long bytes) { live().fetch_sub(bytes); }
  static void reset_peak() { peak().store(live().load()); }
};

template <class T>
struct TrackingAllocator {
  using value_type = T;
  TrackingAllocator() = default;
  template <class U>
  TrackingAllocator(const TrackingAllocator<U>&) {}
  T* allocate(std::size_t n) {
    MemoryCounter::add(static_cast<long long>(n * sizeof(T)));
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, std::size_t n) {
    MemoryCounter::sub(static_cast<long long>(n * sizeof(T)));
    ::operator delete(p, std::align_val_t(64));
  }
  template <class U>
  bool operator==(const TrackingAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const TrackingAllocator<U>&) const { return false; }
};

using Tensor = std::vector<float, TrackingAllocator<float>>;

// Resizes without keeping contents (and without shrinking capacity, so buffers reused across
// micro-batches are allocated once).
inline float* ensure(Tensor& t, std::size_t n) {
  if (t.size() != n) t.resize(n);
  return t.data();
}
inline float* zeros(Tensor& t, std::size_t n) {
  ensure(t, n);
  if (n) std::memset(t.data(), 0, n * sizeof(float));
  return t.data();
}
// Releases the storage (checkpointed activations between forward and backward).
inline void release(Tensor& t) { Tensor().swap(t); }

}  // namespace tedsim::runtime
