#pragma once
// Pieces shared by the fused and the reference gating: argument checks, output sizing and the
// position/weight pass (which is already the plain algorithm, so both use the same code).
#include "tedsim/kernels/cpu/gating.hpp"

namespace tedsim::kernels::detail {

void check_gating_args(int tokens, int experts, const GatingConfig& cfg);
void prepare_output(int tokens, int experts, const GatingConfig& cfg, GatingOutput& out);
void assign_positions_and_weights(GatingOutput& out);

}  // namespace tedsim::kernels::detail
