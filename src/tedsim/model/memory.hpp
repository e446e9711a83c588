#pragma once
// Memory per device for one configuration (DESIGN.md section 4): weights, gradients, optimizer
// state (sharded by ZeRO over the data or expert-data group), activations (Korthikanti et al.
// 2022 for the dense parts, explicit buffers for MoE), the CAC stash and the optimizer's fp32
// upcast spike.
#include "tedsim/model/workload.hpp"

namespace tedsim {

struct MemoryBreakdown {  // bytes
  double weights = 0, grads = 0, optimizer = 0;
  double activations = 0;      // saved for backward at the peak (checkpoints + one layer recomputed)
  double moe_buffers = 0;      // one MoE layer's transient dispatch / all-to-all / expert buffers
  double cac_stash = 0;        // collective outputs kept from the first forward
  double optimizer_spike = 0;  // fp32 upcast of expert gradients during the step
  double peak = 0;
  double capacity = 0;         // usable device memory
  bool fits() const { return peak <= capacity; }
};

MemoryBreakdown estimate_memory(const ModelSpec& model, const ParallelConfig& config, const Workload& workload,
                                const TopologySpec& topology);

}  // namespace tedsim
