#pragma once
// `simulate --ops`: where a layer's time goes, op by op. Each distinct block the plan runs (a dense
// layer, an MoE layer, their sliding-window twins, the embedding, the head and loss, the MTP
// module) is listed with every op of its forward, recompute and backward: the time the profile
// gives it on one rank and micro-batch, its phase, its FLOPs or bytes, and the rate that implies,
// so a user can see which GEMM, kernel or collective a prediction rests on.
#include <ostream>

#include <nlohmann/json.hpp>

#include "tedsim/model/workload.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::cli {

void print_op_breakdown(std::ostream& out, const Workload& workload, const ModelSpec& model);
nlohmann::json op_breakdown_json(const Workload& workload, const ModelSpec& model);

}  // namespace tedsim::cli
