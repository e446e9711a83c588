#include "tedsim/spec/recompute.hpp"

#include <sstream>

#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

struct ModuleName {
  const char* name;
  std::uint8_t bit;
};
constexpr ModuleName kModules[] = {{"core_attn", kRecomputeCoreAttn}, {"layernorm", kRecomputeLayernorm},
                                   {"mlp", kRecomputeMlp},            {"moe_act", kRecomputeMoeAct},
                                   {"moe", kRecomputeMoe},            {"shared_experts", kRecomputeSharedExperts},
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
  std::uint8_t bits = 0;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    bool known = false;
    for (const ModuleName& m : kModules) {
      if (item == m.name) {
        bits |= m.bit;
        known = true;
      }
    }
    if (!known)
      throw InputError("--recompute-modules: unknown module '" + item +
                       "' (expected a comma-separated list of core_attn, layernorm, mlp, moe_act, moe, shared_experts, "
                       "mla_up_proj)");
  }
  if (bits == 0) throw InputError("--recompute-modules: expected at least one module, got '" + list + "'");
  return bits;
}

std::string recompute_modules_text(std::uint8_t modules) {
  std::string text;
  for (const ModuleName& m : kModules)
    if (modules & m.bit) text += (text.empty() ? "" : ",") + std::string(m.name);
  return text;
}

}  // namespace tedsim
