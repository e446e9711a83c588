// A tensor-parallel block's entry and exit, with and without sequence parallelism (Korthikanti et
// al. 2022; Megatron-Core's sequence_parallel): norms and residuals run on this rank's Tl = T/t
// token rows, and each block gathers its input's rows from the tensor group and reduce-scatters
// its partial output back to them (the backward swaps the two).
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

const float* StepContext::sp_gather(const float* local, Tensor& full, const char* name) {
  if (!dims.sequence_parallel) return local;
  const std::size_t Th = static_cast<std::size_t>(dims.tokens) * dims.hidden;
  collective(Coll::all_gather, *tp, local, ensure(full, Th), Th, kTpAllGather, name);
  return full.data();
}

float* StepContext::block_output(float* local) {
  return dims.sequence_parallel ? ensure(ws.sp_part, static_cast<std::size_t>(dims.tokens) * dims.hidden) : local;
}

void StepContext::block_exit(float* partial, float* local, const char* allreduce_name, const char* sp_name) {
  if (!dims.sequence_parallel) {
    tp_allreduce(partial, static_cast<std::size_t>(dims.tokens) * dims.hidden, allreduce_name);
    return;
  }
  collective(Coll::reduce_scatter, *tp, partial, local, static_cast<std::size_t>(dims.local_tokens) * dims.hidden,
             kTpAllReduce, sp_name);
}

}  // namespace tedsim::runtime
