#pragma once
// Pieces every layer builder shares (layer_ops.cpp, moe_ops.cpp): the entry and exit of a
// tensor-parallel block, the residual add, the norm before the MLP or MoE half.
#include "tedsim/model/layer_ops.hpp"

namespace tedsim {

// The entry and exit of a tensor-parallel block: the identity / all-reduce pair of Megatron's
// column- and row-parallel linears, or sequence parallelism's all-gather / reduce-scatter.
inline void tp_block_entry(BlockBuilder& x, const LayerDims& d, const char* sp_name) {
  if (d.sp) x.collective(sp_name, CollectiveOp::all_gather, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allgather);
}
inline void tp_block_exit(BlockBuilder& x, const LayerDims& d, const char* allreduce_name, const char* sp_name) {
  if (d.sp)
    x.collective(sp_name, CollectiveOp::reduce_scatter, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allreduce);
  else
    x.collective(allreduce_name, CollectiveOp::all_reduce, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allreduce);
}

// The residual add reads the block's output and the residual and writes the sum; with hidden
// dropout, Megatron's fused bias-dropout-add also writes a one-byte mask per element.
inline double residual_bytes(const LayerDims& d) {
  return (3.0 * d.B + (d.hidden_dropout ? 1.0 : 0.0)) * double(d.T_local) * double(d.h);
}

// The norm before the MLP or MoE half of a layer (captured with the router or the MLP).
inline void pre_mlp_layernorm(BlockBuilder& x, const LayerDims& d) {
  x.set_module(kRecomputeLayernorm);
  x.kernel("layernorm_mlp", KernelKind::layernorm, 2.0 * d.T_local * d.h * d.B);
  x.set_module(0);
}

}  // namespace tedsim
