#pragma once
// Row-major fp32 GEMM, BLAS semantics: C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C.
// op(A) = A ([m,k], leading dimension lda) or A^T (A stored [k,m]); likewise B. With beta == 0,
// C is not read (so it may hold garbage or NaN), as in BLAS.
#include <vector>

namespace tedsim::kernels {

struct GemmOp {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// Eigen-backed (single thread unless Eigen is built with OpenMP).
void gemm(const GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
          int ldc);

// Naive triple loop with fp64 accumulation: the reference for tests.
void gemm_reference(const GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                    float* c, int ldc);

// One problem of a grouped GEMM: local experts each multiply their own token count (m varies
// with the expert's kept tokens; k varies for weight gradients, where tokens are the contraction).
struct GemmProblem {
  int m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int lda = 0;
  const float* b = nullptr;
  int ldb = 0;
  float* c = nullptr;
  int ldc = 0;
};

// Runs every problem with the same op (a loop of gemm calls; empty problems are skipped, but with
// k == 0 and m,n > 0 C is still scaled by beta, as BLAS does).
void gemm_grouped(const GemmOp& op, const std::vector<GemmProblem>& problems);

// Convenience for the expert FFN layout: A is [groups, rows_stride, k] (group g uses its first
// m[g] rows), B is [groups, k, n] (or [groups, n, k] with trans_b), C is [groups, rows_stride, n]. op.trans_a must be false (InputError).
void gemm_grouped_strided(const GemmOp& op, int groups, const int* m, int rows_stride, int n, int k,
                          const float* a, const float* b, float* c);

// 2*m*n*k, the FLOP count convention used by the benchmarks.
inline double gemm_flops(double m, double n, double k) { return 2.0 * m * n * k; }

}  // namespace tedsim::kernels
