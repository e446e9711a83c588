#pragma once
// What the backward pass recomputes instead of keeping (Korthikanti et al. 2022; Megatron-Core's
// --recompute-granularity and --recompute-modules).
#include <cstdint>
#include <string>

namespace tedsim {

enum class Recompute : std::uint8_t {
  none,       // keep every activation
  selective,  // recompute only the listed modules (default: the attention core)
  full,       // keep each layer's input, recompute the whole layer in backward
};
const char* to_string(Recompute r);
Recompute parse_recompute(const std::string& text);  // "none", "selective", "full"

// Megatron-Core's recompute module names, as a bit set.
enum RecomputeModule : std::uint8_t {
  kRecomputeCoreAttn = 1 << 0,       // QK^T, softmax, dropout, attention over V
  kRecomputeLayernorm = 1 << 1,      // the two layernorms (their outputs are not kept)
  kRecomputeMlp = 1 << 2,            // the dense MLP
  kRecomputeMoeAct = 1 << 3,         // the experts' activation function
  kRecomputeMoe = 1 << 4,            // the whole MoE block (router, dispatch, experts, combine)
  kRecomputeSharedExperts = 1 << 5,  // shared experts (models without them: no effect)
  kRecomputeMlaUpProj = 1 << 6,      // MLA's up projections and RoPE: q, k and v from the latents
};
inline constexpr std::uint8_t kDefaultRecomputeModules = kRecomputeCoreAttn;

// "core_attn,mlp" -> bit set; throws InputError naming the unknown module and the valid names.
std::uint8_t parse_recompute_modules(const std::string& list);
std::string recompute_modules_text(std::uint8_t modules);  // "core_attn,mlp"

}  // namespace tedsim
