#include <cublas_api.h>
#include <cuda_runtime.h>
#include <library_types.h>
#if TEDSIM_CALIBRATION_HAVE_NCCL
#include <nccl.h>
#endif

#include <string>

#include "tedsim/calibration/provenance.hpp"

namespace tedsim::calibration {

namespace {
std::string version(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
}  // namespace

void add_cuda_provenance(Provenance& p) {
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess) p.driver = "CUDA driver API " + version(v);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) p.cuda = version(v);
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  p.cublas = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
#if TEDSIM_CALIBRATION_HAVE_NCCL
  if (ncclGetVersion(&v) == ncclSuccess)
    p.nccl = std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
#endif
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    p.devices = {prop.name};
}

}  // namespace tedsim::calibration
