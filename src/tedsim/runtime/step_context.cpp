// The shared services of the step's modules: GEMM shapes, the model's activation, and the timed
// collectives with CAC's record and replay.
#include "tedsim/runtime/step_context.hpp"

#include <vector>

#include "tedsim/kernels/cpu/rotary.hpp"

namespace tedsim::runtime {

void StepContext::mm(int m, int n, int k, const float* a, const float* w, float* c, float beta) {
  kernels::GemmOp op;
  op.beta = beta;
  ops.gemm_weight(op, m, n, k, a, k, w, n, c, n);
}

void StepContext::mm_bt(int m, int n, int k, const float* a, const float* w, float* c, float beta) {
  kernels::GemmOp op;
  op.trans_b = true;
  op.beta = beta;
  ops.gemm_weight(op, m, n, k, a, k, w, k, c, n);
}

void StepContext::mm_at_acc(int m, int n, int k, const float* a, const float* b, float* c) {
  kernels::GemmOp op;
  op.trans_a = true;
  op.beta = 1.0f;
  ops.gemm(op, m, n, k, a, m, b, n, c, n);
}

void StepContext::rotary_forward(float* qkv) {
  // The query heads, then the key heads: the first (heads + kv_heads) x head_dim columns.
  rotary(qkv, dims.local_heads + dims.local_kv_heads, dims.head_dim, dims.local_qkv_width, false);
}

void StepContext::rotary_backward(float* grad_qkv) {
  rotary(grad_qkv, dims.local_heads + dims.local_kv_heads, dims.head_dim, dims.local_qkv_width, true);
}

void StepContext::rotary(float* x, int heads, int head_dim, int row_stride, bool backward) {
  const StepDims& d = dims;
  if (d.rotary_dim == 0) return;
  if (rope_cos.empty()) {
    const std::size_t n = static_cast<std::size_t>(d.seq) * (d.rotary_dim / 2);
    std::vector<float> cos(n), sin(n);
    kernels::rotary_table(d.seq, d.rotary_dim, model.rope_theta, cos.data(), sin.data());
    ops.from_host(cos.data(), ensure(rope_cos, n), n);
    ops.from_host(sin.data(), ensure(rope_sin, n), n);
  }
  if (backward)
    ops.rotary_backward(d.tokens, d.seq, heads, head_dim, d.rotary_dim, row_stride, rope_cos.data(), rope_sin.data(), x);
  else
    ops.rotary_forward(d.tokens, d.seq, heads, head_dim, d.rotary_dim, row_stride, rope_cos.data(), rope_sin.data(), x);
}

void StepContext::activation_forward(int rows, int width, const float* x, float* y) {
  if (dims.swiglu)
    ops.swiglu_forward(rows, width, x, y);
  else
    ops.gelu_forward(static_cast<std::size_t>(rows) * width, x, y);
}

void StepContext::activation_backward(int rows, int width, const float* x, const float* gy, float* gx) {
  if (dims.swiglu)
    ops.swiglu_backward(rows, width, x, gy, gx);
  else
    ops.gelu_backward(static_cast<std::size_t>(rows) * width, x, gy, gx);
}

void StepContext::collective(Coll kind, Communicator& comm, const float* sendbuf, float* recvbuf,
                             std::size_t recv_count, int ph, const char* name) {
  if (mode == CommMode::replay) {
    Tensor& saved = (*cur_stash)[stash_next++];
    ops.copy(recvbuf, saved.data(), recv_count);
    return;
  }
  const int n = comm.size();
  if (n == 1) {
    ops.copy(recvbuf, sendbuf, recv_count);
  } else {
    const double t0 = clock();
    switch (kind) {
      case Coll::all_reduce: comm.all_reduce(sendbuf, recvbuf, recv_count, Dtype::fp32); break;
      case Coll::all_gather: comm.all_gather(sendbuf, recvbuf, recv_count / n, Dtype::fp32); break;
      case Coll::reduce_scatter: comm.reduce_scatter(sendbuf, recvbuf, recv_count, Dtype::fp32); break;
      case Coll::all_to_all: comm.all_to_all(sendbuf, recvbuf, recv_count / n, Dtype::fp32); break;
    }
    comm.wait();
    charge(ph, name, t0, now_s());
  }
  if (mode == CommMode::record) {
    cur_stash->emplace_back();
    ops.copy(ensure(cur_stash->back(), recv_count), recvbuf, recv_count);
  }
}

void StepContext::all_to_all_v(const float* sendbuf, const std::vector<std::size_t>& send_counts, float* recvbuf,
                               const std::vector<std::size_t>& recv_counts, const char* name) {
  std::size_t recv_total = 0;
  for (std::size_t c : recv_counts) recv_total += c;
  if (mode == CommMode::replay) {
    Tensor& saved = (*cur_stash)[stash_next++];
    ops.copy(recvbuf, saved.data(), recv_total);
    return;
  }
  if (ep->size() == 1) {
    ops.copy(recvbuf, sendbuf, recv_total);
  } else {
    const double t0 = clock();
    ep->all_to_all_v(sendbuf, send_counts, recvbuf, recv_counts, Dtype::fp32);
    ep->wait();
    charge(kEpAllToAll, name, t0, now_s());
  }
  if (mode == CommMode::record) {
    cur_stash->emplace_back();
    ops.copy(ensure(cur_stash->back(), std::max<std::size_t>(recv_total, 1)), recvbuf, recv_total);
  }
}

}  // namespace tedsim::runtime
