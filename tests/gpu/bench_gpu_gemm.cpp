// The CUDA step's GEMM against the GEMMs it could be, on gpu-moe's shapes (2048 tokens, hidden
// 2048, ffn 8192, vocabulary 50304, 128 tokens per expert), each in the step's three layouts
// (forward NN, input gradient NT, weight gradient TN):
//   step      cuda::gemm_bf16_compute: fp32 tensors, rounded to bf16 copies, bf16 GEMM into fp32
//   step_w    the step's GEMM on a weight (forward, input gradient): only A is rounded, B's bf16
//             copy is made once per step (cuda::gemm_bf16_compute_rounded_b, weight_copies.hpp)
//   fast16bf  fp32 tensors straight into cuBLAS with CUBLAS_COMPUTE_32F_FAST_16BF (the step's
//             GEMM before; it ran 3.7x slower than calibrated on an H200)
//   bf16      bf16 tensors, bf16 GEMM into bf16 (what calibrate times and Megatron runs)
// and the step's two parts apart, to say which one costs what:
//   round     only the step's rounding of both operands to bf16 copies (TFLOP/s of the GEMM it
//             serves, so the time is what compares)
//   bf16_f32  bf16 tensors, bf16 GEMM into fp32 (the step's GEMM without the rounding)
// Counters: TFLOP/s. One process, one device, so the paths compare as ratios.
//   bench_gpu_gemm [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <cublas_v2.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tedsim/kernels/cpu/gemm.hpp"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"
#include "tedsim/kernels/device.hpp"

namespace cu = tedsim::kernels::cuda;
using tedsim::Dtype;
using tedsim::kernels::GemmOp;

namespace {

enum Path { kStep, kFast16bf, kBf16, kRound, kBf16F32, kStepWeight };
enum Layout { kNN, kNT, kTN };

struct Shape {
  const char* name;
  int m, n, k;
};
const Shape kShapes[] = {{"dense_fc1", 2048, 8192, 2048}, {"dense_fc2", 2048, 2048, 8192},
                         {"qkv", 2048, 6144, 2048},        {"lm_head", 2048, 50304, 2048},
                         {"expert_fc1", 128, 8192, 2048}};

void run(benchmark::State& state, Shape s, Path path, Layout layout) {
  GemmOp op;
  op.trans_a = layout == kTN;
  op.trans_b = layout == kNT;
  const int lda = op.trans_a ? s.m : s.k, ldb = op.trans_b ? s.k : s.n;
  const std::size_t in_elem = path == kBf16 || path == kBf16F32 ? 2 : 4, out_elem = path == kBf16 ? 2 : 4;
  cu::DeviceBuffer a(static_cast<std::size_t>(s.m) * s.k * in_elem), b(static_cast<std::size_t>(s.k) * s.n * in_elem),
      c(static_cast<std::size_t>(s.m) * s.n * out_elem), rounded(static_cast<std::size_t>(s.m + s.n) * s.k * 2);
  a.zero();
  b.zero();
  c.zero();
  cu::BlasHandle blas;
  cublasHandle_t raw = nullptr;
  if (path == kFast16bf || path == kBf16F32) cublasCreate(&raw);
  const int a_rows = op.trans_a ? s.k : s.m, b_rows = op.trans_b ? s.n : s.k;
  auto once = [&] {
    switch (path) {
      case kStep:
        cu::gemm_bf16_compute(blas, op, s.m, s.n, s.k, a.as<float>(), lda, b.as<float>(), ldb, c.as<float>(), s.n);
        break;
      case kStepWeight:
        cu::gemm_bf16_compute_rounded_b(blas, op, s.m, s.n, s.k, a.as<float>(), lda, rounded.data(), c.as<float>(),
                                        s.n);
        break;
      case kBf16: cu::gemm(blas, Dtype::bf16, op, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c.data(), s.n); break;
      case kFast16bf:
        // Row-major through column-major cuBLAS, as cuda/blas.cu does.
        cublasGemmEx(raw, op.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.n, s.m,
                     s.k, &op.alpha, b.data(), CUDA_R_32F, ldb, a.data(), CUDA_R_32F, lda, &op.beta, c.data(),
                     CUDA_R_32F, s.n, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
        break;
      case kRound:
        cu::convert_rows_to_bf16(a_rows, lda, a.as<float>(), lda, rounded.data());
        cu::convert_rows_to_bf16(b_rows, ldb, b.as<float>(), ldb,
                                 rounded.as<char>() + static_cast<std::size_t>(s.m) * s.k * 2);
        break;
      case kBf16F32:
        cublasGemmEx(raw, op.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.n, s.m,
                     s.k, &op.alpha, b.data(), CUDA_R_16BF, ldb, a.data(), CUDA_R_16BF, lda, &op.beta, c.data(),
                     CUDA_R_32F, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        break;
    }
  };
  once();  // cuBLAS's heuristics and the step's scratch, outside the timing
  cu::synchronize();
  constexpr int kCallsPerIteration = 10;  // one synchronization per ten GEMMs
  for (auto _ : state) {
    for (int i = 0; i < kCallsPerIteration; ++i) once();
    cu::synchronize();
  }
  if (raw) cublasDestroy(raw);
  const double flops = 2.0 * s.m * s.n * s.k * kCallsPerIteration;
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  const char* paths[] = {"step", "fast16bf", "bf16", "round", "bf16_f32", "step_w"};
  const char* layouts[] = {"NN", "NT", "TN"};
  for (const Shape& s : kShapes)
    for (int l = 0; l < 3; ++l)
      for (int p = 0; p < 6; ++p) {
        if (Path(p) == kStepWeight && Layout(l) == kTN) continue;  // the weight gradient reads no weight
        benchmark::RegisterBenchmark((std::string(s.name) + "/" + layouts[l] + "/" + paths[p]).c_str(), run, s,
                                     Path(p), Layout(l))
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.05);
      }
}

}  // namespace

int main(int argc, char** argv) {
  if (tedsim::kernels::cuda_device_count() == 0) {
    std::printf("bench_gpu_gemm: no CUDA device (%s); nothing to time\n",
                tedsim::kernels::describe_cuda_unavailable().c_str());
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
