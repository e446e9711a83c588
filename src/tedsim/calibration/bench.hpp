#pragma once
// Device side of calibration: prepares one GEMM or memory-bound kernel on this rank's device
// (inputs allocated and filled once), checks it against its CPU reference, and times repetitions
// on the device's own clock (steady_clock on CPU, CUDA events on the GPU).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tedsim/profile/profile.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::calibration {

struct Prepared {
  std::function<void()> run;            // one repetition (may only enqueue; time() waits)
  std::function<std::int64_t()> check;  // elements differing from the CPU reference (runs once)
  double bytes = 0;                     // kernels: bytes actually moved, as the cost model counts them
  std::optional<Dtype> dtype;           // kernels: what it runs in when not the bench's dtype (Adam: fp32)
  std::string what;                     // for messages
  explicit operator bool() const { return bool(run); }
};

class Bench {
 public:
  virtual ~Bench() = default;
  virtual std::string device_name() const = 0;
  virtual Dtype dtype() const = 0;  // what GEMMs and kernels run in
  virtual Prepared gemm(const GemmShape& shape) = 0;
  // A kernel moving about `bytes` with the model's dimensions (hidden, experts, top-k, activation);
  // an empty Prepared when this device has no such kernel.
  virtual Prepared kernel(KernelKind kind, double bytes, const ModelSpec& model) = 0;
  // `warmup` untimed runs, then up to `reps` timed ones (at least 3, stopping once `budget_s` is
  // spent); seconds of each.
  virtual std::vector<double> time(const Prepared& p, int warmup, int reps, double budget_s) = 0;
  // Before each timed collective: leave the caches as the step leaves a collective's buffers.
  // Nothing by default (NCCL reads and writes device memory over the links either way).
  virtual void cool_caches() {}
};

std::unique_ptr<Bench> make_cpu_bench();
// Throws RunError("no CUDA device: ...") when the build or the machine has none.
std::unique_ptr<Bench> make_cuda_bench(Dtype dtype);

// Host-side helpers shared by both benches.
std::vector<float> random_vector(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f);
std::string cpu_model_name();

}  // namespace tedsim::calibration
