// Per-head GEMMs through Eigen maps (the score and context products dominate), with the masked
// softmax done row by row in between. Masked entries get probability exactly 0.
#include "tedsim/kernels/cpu/attention.hpp"

#include <Eigen/Core>
#include <cmath>
#include <limits>

#include "tedsim/kernels/cpu/fast_math.hpp"

namespace tedsim::kernels {

namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat>;
using Map = Eigen::Map<RowMat>;
}  // namespace

void attention_forward(int heads, int seq, int head_dim, int v_dim, bool causal, const float* q, const float* k,
                       const float* v, float* probs, float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::size_t sd = static_cast<std::size_t>(seq) * head_dim, sv = static_cast<std::size_t>(seq) * v_dim;
  const std::size_t ss = static_cast<std::size_t>(seq) * seq;
  for (int hd = 0; hd < heads; ++hd) {
    ConstMap qm(q + hd * sd, seq, head_dim), km(k + hd * sd, seq, head_dim), vm(v + hd * sv, seq, v_dim);
    Map pm(probs + hd * ss, seq, seq), om(out + hd * sv, seq, v_dim);
    pm.noalias() = scale * (qm * km.transpose());
    for (int i = 0; i < seq; ++i) {
      float* row = probs + hd * ss + static_cast<std::size_t>(i) * seq;
      const int valid = causal ? i + 1 : seq;
      float m = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < valid; ++j) m = row[j] > m ? row[j] : m;
      const float s = detail::exp_shifted_row(row, m, row, valid);
      const float inv = 1.0f / s;
      for (int j = 0; j < valid; ++j) row[j] *= inv;
      for (int j = valid; j < seq; ++j) row[j] = 0.0f;
    }
    om.noalias() = pm * vm;
  }
}

void attention_backward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k, const float* v,
                        const float* probs, const float* grad_out, float* grad_q, float* grad_k, float* grad_v) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::size_t sd = static_cast<std::size_t>(seq) * head_dim, sv = static_cast<std::size_t>(seq) * v_dim;
  const std::size_t ss = static_cast<std::size_t>(seq) * seq;
  RowMat ds(seq, seq);
  for (int hd = 0; hd < heads; ++hd) {
    ConstMap qm(q + hd * sd, seq, head_dim), km(k + hd * sd, seq, head_dim), vm(v + hd * sv, seq, v_dim);
    ConstMap pm(probs + hd * ss, seq, seq), gom(grad_out + hd * sv, seq, v_dim);
    Map gq(grad_q + hd * sd, seq, head_dim), gk(grad_k + hd * sd, seq, head_dim), gv(grad_v + hd * sv, seq, v_dim);
    gv.noalias() = pm.transpose() * gom;
    ds.noalias() = gom * vm.transpose();  // dP
    for (int i = 0; i < seq; ++i) {
      float dot = 0.0f;
      for (int j = 0; j < seq; ++j) dot += ds(i, j) * pm(i, j);
      for (int j = 0; j < seq; ++j) ds(i, j) = pm(i, j) * (ds(i, j) - dot);
    }
    gq.noalias() = scale * (ds * km);
    gk.noalias() = scale * (ds.transpose() * qm);
  }
}

}  // namespace tedsim::kernels
