// Eigen maps over caller memory: no copies. Row-major maps with an outer stride express the
// leading dimensions; a transpose is a free view of the stored matrix.
#include "tedsim/kernels/cpu/gemm.hpp"

#include <Eigen/Core>

#include "tedsim/core/error.hpp"

namespace tedsim::kernels {

namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;

template <class OpA, class OpB>
void run(const GemmOp& op, Map& c, const OpA& a, const OpB& b) {
  if (op.beta == 0.0f) {
    if (op.alpha == 1.0f) {
      c.noalias() = a * b;
    } else {
      c.noalias() = op.alpha * (a * b);
    }
  } else {
    if (op.beta != 1.0f) c *= op.beta;
    c.noalias() += op.alpha * (a * b);
  }
}
}  // namespace

void gemm(const GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
          int ldc) {
  if (m <= 0 || n <= 0) return;
  Map cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k <= 0) {
    if (op.beta == 0.0f) {
      cm.setZero();
    } else {
      cm *= op.beta;
    }
    return;
  }
  // Stored shapes: A is [m,k] or [k,m]; B is [k,n] or [n,k].
  ConstMap am(a, op.trans_a ? k : m, op.trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap bm(b, op.trans_b ? n : k, op.trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!op.trans_a && !op.trans_b) run(op, cm, am, bm);
  if (!op.trans_a && op.trans_b) run(op, cm, am, bm.transpose());
  if (op.trans_a && !op.trans_b) run(op, cm, am.transpose(), bm);
  if (op.trans_a && op.trans_b) run(op, cm, am.transpose(), bm.transpose());
}

void gemm_reference(const GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                    float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int p = 0; p < k; ++p) {
        const float av = op.trans_a ? a[p * lda + i] : a[i * lda + p];
        const float bv = op.trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += static_cast<double>(av) * bv;
      }
      const double prev = op.beta == 0.0f ? 0.0 : static_cast<double>(op.beta) * c[i * ldc + j];
      c[i * ldc + j] = static_cast<float>(op.alpha * acc + prev);
    }
  }
}

void gemm_grouped(const GemmOp& op, const std::vector<GemmProblem>& problems) {
  for (const GemmProblem& p : problems) gemm(op, p.m, p.n, p.k, p.a, p.lda, p.b, p.ldb, p.c, p.ldc);
}

void gemm_grouped_strided(const GemmOp& op, int groups, const int* m, int rows_stride, int n, int k,
                          const float* a, const float* b, float* c) {
  if (op.trans_a) throw InputError("gemm_grouped_strided: A is stored [rows, k]; trans_a is not supported");
  std::vector<GemmProblem> problems(groups);
  for (int g = 0; g < groups; ++g) {
    GemmProblem& p = problems[g];
    p.m = m[g];
    p.n = n;
    p.k = k;
    p.a = a + static_cast<std::size_t>(g) * rows_stride * k;
    p.lda = k;
    p.b = b + static_cast<std::size_t>(g) * k * n;
    p.ldb = op.trans_b ? k : n;
    p.c = c + static_cast<std::size_t>(g) * rows_stride * n;
    p.ldc = n;
  }
  gemm_grouped(op, problems);
}

}  // namespace tedsim::kernels
