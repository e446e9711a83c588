#pragma once
// How a run computes the attention core: unfused (a batched GEMM, a softmax kernel, a batched
// GEMM: Megatron-LM's CoreAttention, and what tedsim's CPU step runs) or fused (FlashAttention /
// cuDNN's fused attention, Transformer Engine's default on Ampere and later GPUs), which keeps no
// s x s tensor for the backward and recomputes it there.
#include <cstdint>
#include <string>

namespace tedsim {

enum class AttentionKernel : std::uint8_t { unfused, flash };

constexpr const char* to_string(AttentionKernel k) { return k == AttentionKernel::flash ? "flash" : "unfused"; }
// "unfused" or "flash"; throws InputError naming `what` (the flag or key) otherwise.
AttentionKernel parse_attention_kernel(const std::string& text, const std::string& what);

}  // namespace tedsim
