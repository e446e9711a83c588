#pragma once
#include "tedsim/comm/communicator.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::test {

Communicator& runtime_world();

// A small MoE decoder: layers alternate dense / MoE, grouped-query attention (kv_heads = heads/2),
// top-2 routing with a capacity factor large enough that no token is ever dropped.
inline ModelSpec small_moe(int layers = 2, Activation act = Activation::gelu, bool tied = true) {
  ModelSpec m;
  m.name = "test-moe";
  m.source = "runtime tests";
  m.layers = layers;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn = 64;
  m.activation = act;
  m.vocab = 64;
  m.seq_len = 16;
  m.dtype = Dtype::fp32;
  m.tie_embeddings = tied;
  m.moe.experts = 4;
  m.moe.every = 2;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 8.0;  // C = 2*8*T/4 = 4T >= k*T: nothing dropped
  m.moe.min_capacity = 4;
  return m;
}

}  // namespace tedsim::test
