#pragma once
// Megatron-Core's flex token dispatcher (--moe-token-dispatcher-type flex over DeepEP or
// HybridEP): a token crosses to each GPU holding any of its experts once, not once per expert as
// the alltoall dispatcher's permuted token-expert pairs do; and when the expert group spans nodes,
// it crosses the network once per destination node (RDMA to the peer GPU of the same local index,
// then NVLink forwarding inside that node). DeepEP's README (deepseek-ai/DeepEP, "normal kernels")
// and Megatron-LM's fused_a2a.py describe both legs; the two run pipelined, so the slower sets the
// time.
#include "tedsim/model/group_spans.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim {

// The chance that none of a token's top-k experts lies in a contiguous, aligned block of `members`
// of the model's experts (a GPU's, or a node's), under uniform routing: C(E - members, k) / C(E, k).
// Group-limited routing (DeepSeek-V3: experts in `groups` groups, each token's within its best
// `topk_groups`) first picks the groups, uniformly, then the k experts uniformly among the chosen
// groups' experts; a block within one group is missed when its group is not chosen or none of the
// k lands in it, and a block of several whole groups when none of the k lands in its chosen ones.
double routing_miss_probability(const MoeSpec& moe, double members);

// Expected distinct destinations of one token over a group of `slots` equal, contiguous blocks of
// the experts (GPUs of the expert group, or its nodes), its own included.
double expected_destinations(const MoeSpec& moe, int slots);

// One flex all-to-all over the slowest expert group of `set`: `pair_bytes` is what the alltoall
// dispatcher would send per rank (every token-expert pair); the flex dispatcher sends each token
// once per destination GPU over NVLink and once per destination node over the network.
double flex_all_to_all_seconds(const Profile& profile, const SpanSet& set, const MoeSpec& moe, double pair_bytes);

}  // namespace tedsim
