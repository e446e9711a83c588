#pragma once
// Launches the routers share (moe.cu): DeepSpeed's gating and today's routers (router.cu) place
// their choices and compute the balance loss the same way. Host functions over device arrays,
// queued on the default stream.
namespace tedsim::kernels::cuda::detail {

// positions [T,k] of each choice in its expert's buffer: an ordered prefix count over the j-major
// choice sequence (all j-th choices before any (j+1)-th, token order inside), -1 at or past
// `capacity`; routed[e] every choice of e, kept[e] = min(routed[e], capacity).
void launch_choice_positions(const int* expert, int tokens, int k, int experts, int capacity, int* position,
                             int* routed, int* kept);

// prob_sum[e] = sum over tokens of probs[t,e]; aux = E * sum_e (prob_sum[e] / T) (top1_count[e] / T).
void launch_balance_loss(const float* probs, const int* top1_count, int tokens, int experts, float* prob_sum,
                         float* aux);

}  // namespace tedsim::kernels::cuda::detail
