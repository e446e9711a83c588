#include "tedsim/runtime/layers/embedding.hpp"

namespace tedsim::runtime {

Slice vocab_rows(const StepDims& d) {
  return ParamRegistrar::slice(1, d.vocab, d.hidden, 0, 1, d.vocab_first, d.vocab_first + d.vocab_local, {{0, d.hidden}});
}

int add_embedding_copy(ParamRegistrar& reg, const StepContext& c, float stdv) {
  return reg.add("embedding.copy", "embedding", 1, false, false, vocab_rows(c.dims), 0, stdv, true);
}

void Embedding::register_params(ParamRegistrar& reg, const StepContext& c, float stdv) {
  reg.set_unit(0);
  table_ = reg.add("embedding", "embedding", 1, false, false, vocab_rows(c.dims), 0, stdv);
}

void Embedding::register_copy(ParamRegistrar& reg, const StepContext& c, float stdv) {
  reg.set_unit(c.dims.layers + 1);
  table_ = add_embedding_copy(reg, c, stdv);
}

void Embedding::forward(StepContext& c, const std::int32_t* tokens, float* x) {
  const StepDims& d = c.dims;
  const double t0 = c.clock();
  float* rows = c.block_output(x);
  c.ops.embedding_forward(d.tokens, d.hidden, d.vocab_first, d.vocab_local, tokens, c.P(table_), rows);
  c.charge(kOther, "embedding_lookup", t0, c.clock());
  const CommMode saved = c.mode;  // the embedding is never recomputed
  c.mode = CommMode::live;
  c.block_exit(rows, x, "tp_allreduce_embedding", "sp_reducescatter_embedding");
  c.mode = saved;
}

void Embedding::backward(StepContext& c, const std::int32_t* tokens, const float* g) {
  const StepDims& d = c.dims;
  const float* gy = c.sp_gather(g, c.ws.sp_grad, "sp_allgather_embedding_bwd");
  const double t0 = c.clock();
  c.ops.embedding_backward(d.tokens, d.hidden, d.vocab_first, d.vocab_local, tokens, gy, c.G(table_));
  c.charge(kOther, "embedding_bwd", t0, c.clock());
}

}  // namespace tedsim::runtime
