// cuBLAS / cuBLASLt GEMMs for row-major operands. cuBLAS is column-major; a row-major [r,c]
// matrix is the column-major [c,r] matrix, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T: swap the operands and the m/n sizes, keep each operand's transpose flag.
// Compute type is CUBLAS_COMPUTE_32F (fp32 accumulate; tensor cores for fp16/bf16), except
// gemm_strided_batched_tf32, which rounds fp32 operands to TF32. gemm_bf16_compute takes fp32
// operands, rounds them to bf16 copies first and multiplies those into fp32;
// gemm_bf16_compute_rounded_b is the same with B already rounded (the step's weight copies).
#include <cublasLt.h>

#include <string>

#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

struct BlasHandle::Impl {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 32u << 20;  // cuBLASLt's recommended size on Hopper
  // gemm_bf16_compute's bf16 copies of its operands. It only grows, to the largest GEMM's size;
  // the step queues everything on one stream, so one call's copies are consumed before the next
  // call's conversion overwrites them.
  void* operands = nullptr;
  std::size_t operand_bytes = 0;
};

BlasHandle::BlasHandle() : impl_(std::make_unique<Impl>()) {
  TEDSIM_CUBLAS_CHECK(cublasCreate(&impl_->blas));
  TEDSIM_CUBLAS_CHECK(cublasLtCreate(&impl_->lt));
  TEDSIM_CUDA_CHECK(cudaMalloc(&impl_->workspace, impl_->workspace_bytes));
  TEDSIM_CUBLAS_CHECK(cublasSetWorkspace(impl_->blas, impl_->workspace, impl_->workspace_bytes));
}

BlasHandle::~BlasHandle() {
  if (impl_->lt) cublasLtDestroy(impl_->lt);
  if (impl_->blas) cublasDestroy(impl_->blas);
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->operands) cudaFree(impl_->operands);
}

namespace {
cudaDataType_t cuda_type(Dtype t) {
  switch (t) {
    case Dtype::fp16: return CUDA_R_16F;
    case Dtype::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}
cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }
}  // namespace

void gemm(BlasHandle& h, Dtype type, const GemmOp& op, int m, int n, int k, const void* a, int lda, const void* b,
          int ldb, void* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const cudaDataType_t t = cuda_type(type);
  TEDSIM_CUBLAS_CHECK(cublasGemmEx(h.impl().blas, op_of(op.trans_b), op_of(op.trans_a), n, m, k, &op.alpha, b, t, ldb,
                                   a, t, lda, &op.beta, c, t, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

namespace {
void* operand_scratch(BlasHandle::Impl& impl, std::size_t bytes) {
  if (bytes > impl.operand_bytes) {
    if (impl.operands) TEDSIM_CUDA_CHECK(cudaFree(impl.operands));  // waits for the GEMMs reading it
    impl.operands = nullptr;
    impl.operand_bytes = 0;
    TEDSIM_CUDA_CHECK(cudaMalloc(&impl.operands, bytes));
    impl.operand_bytes = bytes;
  }
  return impl.operands;
}
}  // namespace

namespace {
// C (fp32) = op(A) op(B) from packed bf16 copies (leading dimension: each one's column count).
void multiply_bf16_into_fp32(BlasHandle& h, const GemmOp& op, int m, int n, int k, const void* a16, int a_cols,
                             const void* b16, int b_cols, float* c, int ldc) {
  TEDSIM_CUBLAS_CHECK(cublasGemmEx(h.impl().blas, op_of(op.trans_b), op_of(op.trans_a), n, m, k, &op.alpha, b16,
                                   CUDA_R_16BF, b_cols > 0 ? b_cols : 1, a16, CUDA_R_16BF, a_cols > 0 ? a_cols : 1,
                                   &op.beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void gemm_bf16_compute(BlasHandle& h, const GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b,
                       int ldb, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  // Stored shapes: A is [m,k] ([k,m] transposed), B is [k,n] ([n,k] transposed).
  const int a_rows = op.trans_a ? k : m, a_cols = op.trans_a ? m : k;
  const int b_rows = op.trans_b ? n : k, b_cols = op.trans_b ? k : n;
  const std::size_t a_bytes = static_cast<std::size_t>(a_rows) * a_cols * 2;
  const std::size_t b_offset = (a_bytes + 255) / 256 * 256;  // cuBLAS's fastest kernels want aligned operands
  const std::size_t b_bytes = static_cast<std::size_t>(b_rows) * b_cols * 2;
  char* scratch = static_cast<char*>(operand_scratch(h.impl(), b_offset + b_bytes + 2));
  void* a16 = scratch;
  void* b16 = scratch + b_offset;
  convert_rows_to_bf16(a_rows, a_cols, a, lda, a16);
  convert_rows_to_bf16(b_rows, b_cols, b, ldb, b16);
  multiply_bf16_into_fp32(h, op, m, n, k, a16, a_cols, b16, b_cols, c, ldc);
}

void gemm_bf16_compute_rounded_b(BlasHandle& h, const GemmOp& op, int m, int n, int k, const float* a, int lda,
                                 const void* b16, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const int a_rows = op.trans_a ? k : m, a_cols = op.trans_a ? m : k;
  void* a16 = operand_scratch(h.impl(), static_cast<std::size_t>(a_rows) * a_cols * 2 + 2);
  convert_rows_to_bf16(a_rows, a_cols, a, lda, a16);
  multiply_bf16_into_fp32(h, op, m, n, k, a16, a_cols, b16, op.trans_b ? k : n, c, ldc);
}

void gemm_strided_batched(BlasHandle& h, Dtype type, const GemmOp& op, int m, int n, int k, const void* a, int lda,
                          long long stride_a, const void* b, int ldb, long long stride_b, void* c, int ldc,
                          long long stride_c, int batch) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  const cudaDataType_t t = cuda_type(type);
  TEDSIM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h.impl().blas, op_of(op.trans_b), op_of(op.trans_a), n, m, k,
                                                 &op.alpha, b, t, ldb, stride_b, a, t, lda, stride_a, &op.beta, c, t,
                                                 ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched_tf32(BlasHandle& h, const GemmOp& op, int m, int n, int k, const float* a, int lda,
                               long long stride_a, const float* b, int ldb, long long stride_b, float* c, int ldc,
                               long long stride_c, int batch) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  TEDSIM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h.impl().blas, op_of(op.trans_b), op_of(op.trans_a), n, m, k,
                                                 &op.alpha, b, CUDA_R_32F, ldb, stride_b, a, CUDA_R_32F, lda,
                                                 stride_a, &op.beta, c, CUDA_R_32F, ldc, stride_c, batch,
                                                 CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
}

void gemm_grouped(BlasHandle& h, Dtype type, const GemmOp& op, const std::vector<DeviceGemmProblem>& problems) {
  // A loop keeps one code path for every CUDA version; cublasGemmGroupedBatchedEx (12.5+) would
  // save launch overhead for many small experts.
  for (const DeviceGemmProblem& p : problems) gemm(h, type, op, p.m, p.n, p.k, p.a, p.lda, p.b, p.ldb, p.c, p.ldc);
}

namespace {
// RAII for the cuBLASLt descriptors so an exception never leaks them.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};
}  // namespace

void gemm_lt(BlasHandle& h, Dtype type, const GemmOp& op, int m, int n, int k, const void* a, int lda,
             const void* b, int ldb, void* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const cudaDataType_t t = cuda_type(type);
  LtDescs d;
  // Column-major view: first operand is B (rows n, cols k when not transposed), second is A.
  const cublasOperation_t first = op_of(op.trans_b), second = op_of(op.trans_a);
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof first));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof second));
  TEDSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, t, op.trans_b ? k : n, op.trans_b ? n : k, ldb));
  TEDSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, t, op.trans_a ? m : k, op.trans_a ? k : m, lda));
  TEDSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, t, n, m, ldc));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  auto& impl = h.impl();
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &impl.workspace_bytes, sizeof impl.workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  TEDSIM_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(impl.lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found));
  if (found == 0) detail::fail(__FILE__, __LINE__, "cublasLt found no algorithm for this GEMM");
  TEDSIM_CUBLAS_CHECK(cublasLtMatmul(impl.lt, d.op, &op.alpha, b, d.a, a, d.b, &op.beta, c, d.c, c, d.c,
                                     &heuristic.algo, impl.workspace, impl.workspace_bytes, nullptr));
}

void gemm_fp8(BlasHandle& h, int m, int n, int k, const void* a, const void* w, const float* a_scale,
              const float* w_scale, void* c) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  if (m % 16 != 0 || n % 16 != 0 || k % 16 != 0)
    throw InputError("cuda::gemm_fp8: m, n and k must be multiples of 16, got " + std::to_string(m) + "x" +
                     std::to_string(n) + "x" + std::to_string(k));
  // Column-major view of C^T[n,m] = W[n,k] A^T: cuBLASLt's A is W, stored [k,n] column-major (the
  // row-major [n,k] weight) and transposed; its B is A, [k,m] column-major, not transposed. That is
  // the "TN" layout FP8 GEMMs take on every FP8 generation.
  LtDescs d;
  const cublasOperation_t trans = CUBLAS_OP_T, none = CUBLAS_OP_N;
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof w_scale));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof a_scale));
  TEDSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, k, n, k));
  TEDSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, k, m, k));
  TEDSIM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_16BF, n, m, n));
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  auto& impl = h.impl();
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &impl.workspace_bytes, sizeof impl.workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  TEDSIM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(impl.lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found));
  if (found == 0) detail::fail(__FILE__, __LINE__, "cublasLt found no algorithm for this FP8 GEMM");
  const float alpha = 1.0f, beta = 0.0f;
  TEDSIM_CUBLAS_CHECK(cublasLtMatmul(impl.lt, d.op, &alpha, w, d.a, a, d.b, &beta, c, d.c, c, d.c, &heuristic.algo,
                                     impl.workspace, impl.workspace_bytes, nullptr));
}

}  // namespace tedsim::kernels::cuda
