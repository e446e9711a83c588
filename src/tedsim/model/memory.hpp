#pragma once
// Memory per device for one configuration (DESIGN.md section 4), stage by stage: weights, gradients,
// optimizer state (sharded by ZeRO over the data or expert-data group; ZeRO-3 shards the weights
// too and keeps the gathered layers), activations of the micro-batches the pipeline schedule keeps
// in flight (Korthikanti et al. 2022 for the dense parts, with none / selective / full recompute
// and sequence parallelism; explicit buffers for MoE), the CAC stash, the p2p buffers and the
// optimizer's fp32 upcast spike.
#include <vector>

#include "tedsim/model/workload.hpp"
#include "tedsim/spec/pipeline_layout.hpp"

namespace tedsim {

struct MemoryBreakdown {  // bytes
  double weights = 0, grads = 0, optimizer = 0;
  double activations = 0;      // saved for backward at the peak (in-flight micro-batches, recompute transient)
  double moe_buffers = 0;      // one MoE layer's transient dispatch / all-to-all / expert buffers
  double cac_stash = 0;        // collective outputs kept from the first forward
  double pipeline_buffers = 0; // p2p send and receive buffers of activations and gradients
  double optimizer_spike = 0;  // fp32 upcast of expert gradients during the step
  double peak = 0;
  double capacity = 0;         // usable device memory
  bool fits() const { return peak <= capacity; }
};

// Bytes one micro-batch keeps for backward per layer (Korthikanti et al. 2022 section 4, scaled by
// activation bytes / 2), as the configuration's recompute and sequence parallelism leave them.
struct LayerActivationBytes {
  double dense = 0, moe = 0;            // kept until the layer's backward
  double dense_full = 0, moe_full = 0;  // everything, without recompute (full recompute's transient)
  double cac_dense = 0, cac_moe = 0;    // CAC's stash per layer
  double moe_transient = 0;             // dispatch, all-to-all receive and expert output buffers
};
// In FP8 training a linear layer keeps its input for the weight gradient as the FP8 column-wise
// copy it quantized in forward (Transformer Engine's Linear, linear.py: the row-wise copy and the
// bf16 input are dropped): `fp8_input_bytes` per element (1, and 1 + 1/32 for MXFP8's scales).
LayerActivationBytes layer_activation_bytes(const ModelSpec& model, const ParallelConfig& config, const StepShape& shape,
                                            double fp8_input_bytes = 1.0);

// The largest stage's memory (what must fit); `stages`, if given, receives every stage's.
MemoryBreakdown estimate_memory(const ModelSpec& model, const ParallelConfig& config, const Workload& workload,
                                const TopologySpec& topology, const StageMap& stage_map,
                                std::vector<MemoryBreakdown>* stages = nullptr);
// Same, with the configuration's own stage map.
MemoryBreakdown estimate_memory(const ModelSpec& model, const ParallelConfig& config, const Workload& workload,
                                const TopologySpec& topology);

}  // namespace tedsim
