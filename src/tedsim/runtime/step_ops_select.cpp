// Chooses the StepOps of a backend; the CUDA ones exist only in CUDA builds.
#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/runtime/step_ops.hpp"

namespace tedsim::runtime {

#if TEDSIM_KERNELS_HAVE_CUDA
std::unique_ptr<StepOps> make_cuda_step_ops(bool weight_copies);  // step_ops_cuda.cpp
#endif

void require_step_ops(Backend backend) {
  if (backend == Backend::cpu) return;
#if !TEDSIM_KERNELS_HAVE_CUDA
  throw RunError("--backend cuda: this tedsim was built without CUDA (no nvcc at configure time); use --backend cpu");
#endif
  std::string why;
  if (!cuda_device_available(&why))
    throw RunError("--backend cuda: no CUDA device: " + why + "; use --backend cpu");
}

std::unique_ptr<StepOps> make_step_ops(Backend backend, GemmRounding rounding) {
  require_step_ops(backend);
  if (backend == Backend::cpu) return make_cpu_step_ops(rounding);
#if TEDSIM_KERNELS_HAVE_CUDA
  return make_cuda_step_ops(rounding.weight_copies);
#else
  return nullptr;  // unreachable: require_step_ops threw
#endif
}

}  // namespace tedsim::runtime
