#pragma once
// Which kernels a training step runs: a StepOps that forwards every call to the real one and counts
// it by kernel name, with the floats it touches. The kernel-list test holds the census of a step
// against the workload's op list, so the runtime cannot run a kernel the cost model does not price.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tedsim/runtime/step_ops.hpp"

namespace tedsim::runtime {

struct KernelCount {
  std::int64_t calls = 0;
  double floats = 0;   // elements written or moved, as the call's sizes say (0 where none is given)
  double seconds = 0;  // wall time of the calls (with fence_each_call on asynchronous backends)
};

struct KernelCensus {
  std::map<std::string, KernelCount> kernels;  // by StepOps method name
  // Asynchronous backends (CUDA) return before the kernel ends: fence after each call to time it,
  // which serialises the step (the counts and the sum stay right; the iteration gets slower).
  bool fence_each_call = false;
  KernelCount& add(const char* name, double floats) {
    KernelCount& k = kernels[name];
    ++k.calls;
    k.floats += floats;
    return k;
  }
};

// `inner`'s calls, counted into `census` (which must outlive the result).
std::unique_ptr<StepOps> with_census(std::unique_ptr<StepOps> inner, KernelCensus& census);

}  // namespace tedsim::runtime
