#include "tedsim/runtime/weight_copies.hpp"

namespace tedsim::runtime {

WeightCopies::~WeightCopies() {
  for (auto& [key, copy] : copies_) space_.deallocate(copy.data);
  MemoryCounter::sub(static_cast<long long>(bytes_));
}

void* WeightCopies::find(const float* w, int rows, int cols, int ld, bool& stale) {
  auto [it, added] = copies_.try_emplace(Key{w, rows, cols, ld});
  Copy& copy = it->second;
  if (added) {
    const std::size_t bytes = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * elem_bytes_;
    try {
      copy.data = space_.allocate(bytes);
    } catch (...) {
      copies_.erase(it);
      throw;
    }
    bytes_ += bytes;
    MemoryCounter::add(static_cast<long long>(bytes));
  }
  stale = copy.version != version_;
  if (stale) {
    copy.version = version_;
    ++fills_;
  } else {
    ++reuses_;
  }
  return copy.data;
}

}  // namespace tedsim::runtime
