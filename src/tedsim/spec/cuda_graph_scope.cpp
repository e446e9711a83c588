#include "tedsim/spec/cuda_graph_scope.hpp"

#include "tedsim/spec/name_bits.hpp"

namespace tedsim {
namespace {

constexpr std::initializer_list<NameBit> kScopes = {
    {"attn", kGraphAttn}, {"mlp", kGraphMlp}, {"moe_router", kGraphMoeRouter}, {"moe_preprocess", kGraphMoePreprocess}};

}  // namespace

std::uint8_t parse_cuda_graph_scopes(const std::string& list) {
  if (list == "none") return 0;
  return parse_name_bits(list, kScopes, "--cuda-graph-scope", "scope",
                         "none, or a comma-separated list of attn, mlp, moe_router, moe_preprocess");
}

std::string cuda_graph_scopes_text(std::uint8_t scopes) {
  const std::string text = name_bits_text(scopes, kScopes);
  return text.empty() ? "none" : text;
}

}  // namespace tedsim
