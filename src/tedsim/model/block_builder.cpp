// BlockBuilder: each op of a layer priced from the profile as it is added (layer_ops.hpp).
#include <algorithm>

#include "tedsim/core/error.hpp"
#include "tedsim/model/flex_dispatch.hpp"
#include "tedsim/model/layer_ops.hpp"

namespace tedsim {

double fp8_quantize_seconds(const Profile& profile, const Fp8Quantize& q, double elements, double tensors, bool after_norm) {
  if (!q.priced() || elements <= 0 || tensors <= 0) return 0.0;
  double one = profile.kernel_seconds(KernelKind::elementwise, q.cast_bytes * elements, Dtype::bf16);
  if (!after_norm && q.amax_bytes > 0) one += profile.kernel_seconds(KernelKind::elementwise, q.amax_bytes * elements, Dtype::bf16);
  one += q.scalar_launches * profile.kernel_seconds(KernelKind::elementwise, 4.0, Dtype::fp32);
  return tensors * one;
}

void BlockBuilder::gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                        Phase phase) {
  add_gemm(name, m, n, k, batch, phase, Input::other);
}

void BlockBuilder::norm_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k) {
  add_gemm(name, m, n, k, 1, Phase::compute, Input::norm);
}

void BlockBuilder::core_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) {
  add_gemm(name, m, n, k, batch, Phase::compute, Input::unquantized);
}

void BlockBuilder::add_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                            Phase phase, Input input, bool grouped) {
  // FP8 training multiplies in FP8 only inside Transformer Engine's linears. The GEMMs outside them
  // stay in bf16: the output layer (Megatron-Core's tensor_parallel.ColumnParallelLinear, a torch
  // matmul), the router's gate (a torch linear) and an unfused attention core.
  const Dtype dtype = input == Input::unquantized ? storage_dtype(dtype_) : dtype_;
  GemmShape shape{m, n, k, batch, dtype, grouped};
  Op op;
  op.name = name;
  op.phase = phase;
  op.flops = shape.flops();
  op.gemm = shape;
  op.module = module_;
  op.graph_scope = graph_scope_;
  op.output_tile = output_tile_;
  op.seconds = profile_.gemm_seconds(tiled_shape(shape, output_tile_));
  const Fp8Quantize q = profile_.fp8_quantize();
  if (dtype_ == Dtype::fp8 && input != Input::unquantized && q.priced()) {
    op.dgrad_quantize = true;
    if (input != Input::quantized) {
      const bool after_norm = input == Input::norm;
      op.quantize_bytes = q.bytes(after_norm) * double(m) * double(k) * double(batch);
      op.seconds += fp8_quantize_seconds(profile_, q, double(m) * double(k), double(batch), after_norm);
      op.host_calls += double(batch);  // the quantizer's call (per expert in a grouped GEMM: below)
    }
  }
  block_.add(op);
}

void BlockBuilder::fused_grouped_mlp(std::int64_t rows, std::int64_t fc1_out, std::int64_t h, std::int64_t ffn,
                                     std::int64_t experts) {
  output_tile_ = kCudnnGroupedGemmTile;
  // The permuted tokens are quantized as one grouped tensor (one quantizer call, not one per expert).
  add_gemm("expert_fc1", rows, fc1_out, h, experts, Phase::compute, Input::other, true);
  Op& fc1 = block_.ops[block_.count - 1];
  fc1.dgrad_quantize = false;
  fc1.host_calls = kGroupedLinearCallsPerCall + 1.0;
  add_gemm("expert_fc2", rows, h, ffn, experts, Phase::compute, Input::quantized, true);
  block_.ops[block_.count - 1].host_calls = kGroupedLinearCallsPerCall;
  output_tile_ = 0;
}

void BlockBuilder::grouped_gemm(const char* name, std::int64_t rows, std::int64_t n, std::int64_t k, std::int64_t experts) {
  add_gemm(name, rows, n, k, experts, Phase::compute, Input::other, true);
  // add_gemm counted one GEMM call and each expert's quantization: the other experts' GEMMs and the
  // grouped call's own come on top.
  block_.ops[block_.count - 1].host_calls += double(experts) * kGroupedLinearCallsPerExpert - 1.0 + kGroupedLinearCallsPerCall;
}

void BlockBuilder::host_calls_at(int index, double calls) { block_.ops[index].host_calls = calls; }

void BlockBuilder::backward_of_last(double bytes, double host_calls) {
  Op& op = block_.ops[block_.count - 1];
  op.backward_bytes = bytes;
  op.backward_host_calls = host_calls;
}

void BlockBuilder::host_calls_of_last(double calls, bool sync, bool forward_only) {
  Op& op = block_.ops[block_.count - 1];
  op.host_calls = calls;
  op.host_sync = sync;
  op.host_resume_calls = sync ? kResumeAfterSyncCalls : 0.0;
  op.forward_only = forward_only;
}

void BlockBuilder::kernel(const char* name, KernelKind kind, double bytes, Phase phase) {
  Op op;
  op.name = name;
  op.phase = phase;
  op.bytes = bytes;
  op.kernel = kind;
  op.gemm.dtype = storage_dtype(dtype_);
  op.module = module_;
  op.graph_scope = graph_scope_;
  op.seconds = profile_.kernel_seconds(kind, bytes, storage_dtype(dtype_));
  block_.add(op);
}

bool BlockBuilder::attention_core(const char* name, AttentionKernel kernel, const AttentionShape& shape) {
  const double seconds = profile_.attention_seconds(kernel, false, shape);
  if (seconds < 0) return false;
  Op op;
  op.name = name;
  op.flops = shape.forward_flops();
  // The fused core runs in bf16 under FP8 training too unless --fp8-attention asks for cuDNN's FP8
  // kernel (Megatron-Core's --fp8-dot-product-attention, off by default; Megatron-Bridge 26.06 sets
  // it for some Blackwell MoE recipes).
  op.gemm = GemmShape{shape.seq, shape.v_head_dim, shape.head_dim, shape.batch_heads, storage_dtype(dtype_)};
  op.is_attention = true;
  op.attention_kernel = kernel;
  op.attention_window = shape.window;
  op.attention_fp8 = shape.fp8;
  op.module = module_;
  op.graph_scope = graph_scope_;
  op.seconds = seconds;
  block_.add(op);
  return true;
}

void BlockBuilder::collective(const char* name, CollectiveOp which, GroupKind group, double bytes, Phase phase) {
  const SpanSet& set = spans_.of(group);
  if (set.count == 0 || set.spans[0].ranks <= 1 || bytes <= 0) return;
  Op op;
  op.name = name;
  op.phase = phase;
  op.bytes = bytes;
  op.is_collective = true;
  op.collective = which;
  op.group = group;
  op.module = module_;
  op.graph_scope = graph_scope_;
  op.seconds = set.seconds(profile_, which, bytes);
  block_.add(op);
}

int BlockBuilder::collective_at(const char* name, CollectiveOp which, GroupKind group, double bytes, Phase phase) {
  const int before = block_.count;
  collective(name, which, group, bytes, phase);
  return block_.count > before ? before : -1;
}

int BlockBuilder::expert_all_to_all_at(const char* name, MoeDispatcher dispatcher, const MoeSpec& moe,
                                       double pair_bytes) {
  // Dropless routing's alltoall dispatcher exchanges uneven counts (MPI_Alltoallv, NCCL grouped
  // send/recv): calibration times that call with the busiest rank's split; the flex dispatcher's
  // kernels are priced below from the even all-to-all's links.
  const CollectiveOp op = moe.dropless() && dispatcher == MoeDispatcher::alltoall ? CollectiveOp::all_to_all_v
                                                                                 : CollectiveOp::all_to_all;
  const int at = collective_at(name, op, GroupKind::expert, pair_bytes, Phase::ep_alltoall);
  if (at >= 0 && dispatcher == MoeDispatcher::flex) {
    Op& op = block_.ops[at];
    const double flex = flex_all_to_all_seconds(profile_, spans_.of(GroupKind::expert), moe, pair_bytes);
    block_.seconds += flex - op.seconds;
    block_.phase_seconds[int(op.phase)] += flex - op.seconds;
    op.seconds = flex;
  }
  return at;
}

double BlockBuilder::seconds_since(int first_op) const {
  double sum = 0;
  for (int i = first_op; i < block_.count; ++i) sum += block_.ops[i].seconds;
  return sum;
}

void BlockBuilder::hide_behind(double seconds, std::initializer_list<int> ops) {
  // Side-stream work that runs during these ops (collectives): it shortens them, down to zero, in
  // order; the compute it does stays on the block as it was added.
  for (int index : ops) {
    if (seconds <= 0) break;
    if (index < 0 || index >= block_.count || !block_.ops[index].is_collective) continue;
    Op& op = block_.ops[index];
    const double hidden = std::min(seconds, op.seconds);
    op.seconds -= hidden;
    block_.seconds -= hidden;
    block_.phase_seconds[int(op.phase)] -= hidden;
    seconds -= hidden;
  }
}

}  // namespace tedsim
