#pragma once
// Which parts of a layer run as captured CUDA graphs, after Megatron-Core's
// --cuda-graph-impl transformer_engine --cuda-graph-scope: a captured region replays with one
// launch from the host instead of one framework call per kernel (model/host_launch.hpp). The
// per-layer D2H synchronisation of MoE dispatch cannot be captured, so the MoE scopes stop at it.
// full_iteration is Megatron-Core's --cuda-graph-impl full_iteration: one graph of the whole
// forward and backward of every micro-batch (the optimizer step stays eager), replayed with one
// launch; dropless MoE then dispatches against HybridEP's per-rank capacity budget instead of
// reading its token counts back (Megatron-Core's moe_expert_rank_capacity_factor), so there is
// no sync either.
#include <cstdint>
#include <string>

namespace tedsim {

enum CudaGraphScope : std::uint8_t {
  kGraphAttn = 1 << 0,           // the attention half of a layer: input norm, QKV, core, output projection
  kGraphMlp = 1 << 1,            // a dense layer's MLP half
  kGraphMoeRouter = 1 << 2,      // an MoE layer's pre-MLP norm and router (gate, scores, top-k)
  kGraphMoePreprocess = 1 << 3,  // the dispatcher's metadata: tokens per expert, split sizes (up to the sync)
  kGraphFullIteration = 1 << 4,  // everything but the optimizer step, in one graph (alone: no other scope beside it)
};

// "attn,moe_router" -> bit set; "none" -> 0; "full_iteration" -> kGraphFullIteration. Throws
// InputError naming an unknown scope and the valid names, or full_iteration listed beside others.
std::uint8_t parse_cuda_graph_scopes(const std::string& list);
std::string cuda_graph_scopes_text(std::uint8_t scopes);  // "attn,moe_router"; "none" for 0

}  // namespace tedsim
