#include "tedsim/spec/cuda_graph_scope.hpp"

#include <sstream>

#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

struct ScopeName {
  const char* name;
  std::uint8_t bit;
};
constexpr ScopeName kScopes[] = {{"attn", kGraphAttn},
                                 {"mlp", kGraphMlp},
                                 {"moe_router", kGraphMoeRouter},
                                 {"moe_preprocess", kGraphMoePreprocess}};

}  // namespace

std::uint8_t parse_cuda_graph_scopes(const std::string& list) {
  if (list == "none") return 0;
  std::uint8_t bits = 0;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    bool known = false;
    for (const ScopeName& s : kScopes) {
      if (item == s.name) {
        bits |= s.bit;
        known = true;
      }
    }
    if (!known)
      throw InputError("--cuda-graph-scope: unknown scope '" + item +
                       "' (expected none, or a comma-separated list of attn, mlp, moe_router, moe_preprocess)");
  }
  if (bits == 0) throw InputError("--cuda-graph-scope: expected none or at least one scope, got '" + list + "'");
  return bits;
}

std::string cuda_graph_scopes_text(std::uint8_t scopes) {
  std::string text;
  for (const ScopeName& s : kScopes)
    if (scopes & s.bit) text += (text.empty() ? "" : ",") + std::string(s.name);
  return text.empty() ? "none" : text;
}

}  // namespace tedsim
