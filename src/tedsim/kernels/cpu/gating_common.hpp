#pragma once
// Pieces shared by the fused and the reference gating: argument checks, output sizing and the
// position/weight pass (which is already the plain algorithm, so both use the same code).
#include "tedsim/kernels/cpu/gating.hpp"

namespace tedsim::kernels::detail {

void check_gating_args(int tokens, int experts, const GatingConfig& cfg);
void prepare_output(int tokens, int experts, const GatingConfig& cfg, GatingOutput& out);
void assign_positions_and_weights(GatingOutput& out);

// gating_forward without the AVX-512 row kernel (scalar top-k scan), so tests can check the
// portable path on a machine that would otherwise never run it.
void gating_forward_portable(const float* logits, int tokens, int experts, const GatingConfig& cfg,
                             GatingOutput& out);

// Whether gating_forward uses the vectorized row kernel for this many experts in this build.
bool gating_has_vector_path(int experts);

}  // namespace tedsim::kernels::detail
