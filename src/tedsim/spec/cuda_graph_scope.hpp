#pragma once
// Which parts of a layer run as captured CUDA graphs, after Megatron-Core's
// --cuda-graph-impl transformer_engine --cuda-graph-scope: a captured region replays with one
// launch from the host instead of one framework call per kernel (model/host_launch.hpp). The
// per-layer D2H synchronisation of MoE dispatch cannot be captured, so the MoE scopes stop at it.
#include <cstdint>
#include <string>

namespace tedsim {

enum CudaGraphScope : std::uint8_t {
  kGraphAttn = 1 << 0,           // the attention half of a layer: input norm, QKV, core, output projection
  kGraphMlp = 1 << 1,            // a dense layer's MLP half
  kGraphMoeRouter = 1 << 2,      // an MoE layer's pre-MLP norm and router (gate, scores, top-k)
  kGraphMoePreprocess = 1 << 3,  // the dispatcher's metadata: tokens per expert, split sizes (up to the sync)
};

// "attn,moe_router" -> bit set; "none" -> 0. Throws InputError naming an unknown scope and the valid names.
std::uint8_t parse_cuda_graph_scopes(const std::string& list);
std::string cuda_graph_scopes_text(std::uint8_t scopes);  // "attn,moe_router"; "none" for 0

}  // namespace tedsim
