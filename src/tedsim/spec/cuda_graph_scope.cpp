#include "tedsim/spec/cuda_graph_scope.hpp"

#include "tedsim/core/error.hpp"
#include "tedsim/spec/name_bits.hpp"

namespace tedsim {
namespace {

constexpr std::initializer_list<NameBit> kScopes = {{"attn", kGraphAttn},
                                                    {"mlp", kGraphMlp},
                                                    {"moe_router", kGraphMoeRouter},
                                                    {"moe_preprocess", kGraphMoePreprocess},
                                                    {"full_iteration", kGraphFullIteration}};

}  // namespace

std::uint8_t parse_cuda_graph_scopes(const std::string& list) {
  if (list == "none") return 0;
  const std::uint8_t scopes = parse_name_bits(
      list, kScopes, "--cuda-graph-scope", "scope",
      "none, full_iteration, or a comma-separated list of attn, mlp, moe_router, moe_preprocess");
  if ((scopes & kGraphFullIteration) && scopes != kGraphFullIteration)
    throw InputError("--cuda-graph-scope: full_iteration captures the whole step and stands alone, got '" + list +
                     "' (Megatron-Core's --cuda-graph-impl full_iteration takes no --cuda-graph-scope)");
  return scopes;
}

std::string cuda_graph_scopes_text(std::uint8_t scopes) {
  const std::string text = name_bits_text(scopes, kScopes);
  return text.empty() ? "none" : text;
}

}  // namespace tedsim
