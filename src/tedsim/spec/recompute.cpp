#include "tedsim/spec/recompute.hpp"

#include "tedsim/core/error.hpp"
#include "tedsim/spec/name_bits.hpp"

namespace tedsim {
namespace {

constexpr std::initializer_list<NameBit> kModules = {
    {"core_attn", kRecomputeCoreAttn}, {"layernorm", kRecomputeLayernorm}, {"mlp", kRecomputeMlp},
    {"moe_act", kRecomputeMoeAct},     {"moe", kRecomputeMoe},             {"shared_experts", kRecomputeSharedExperts},
    {"mla_up_proj", kRecomputeMlaUpProj}};

}  // namespace

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::none;
  if (text == "selective") return Recompute::selective;
  if (text == "full") return Recompute::full;
  throw InputError("--recompute: expected none, selective or full, got '" + text + "'");
}

std::uint8_t parse_recompute_modules(const std::string& list) {
  return parse_name_bits(list, kModules, "--recompute-modules", "module",
                         "a comma-separated list of core_attn, layernorm, mlp, moe_act, moe, shared_experts, mla_up_proj");
}

std::string recompute_modules_text(std::uint8_t modules) { return name_bits_text(modules, kModules); }

}  // namespace tedsim
