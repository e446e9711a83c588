// tedsim model show: what tedsim reads a model as - shape, layer pattern, routing, parameters
// (total and active per token) and FLOPs per token by layer kind - from a shipped name, a model
// YAML or a Hugging Face config.json.
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/model_summary.hpp"
#include "tedsim/report/prediction_json.hpp"
#include "tedsim/report/text_table.hpp"
#include "tedsim/spec/data_files.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::cli {
namespace {

struct ModelShowOptions {
  std::string model;
  std::string json;
  int seq_len = 0;
};

std::string billions(double n) { return fixed(n / 1e9, n < 1e10 ? 3 : 2) + " B"; }
std::string millions(double n) { return fixed(n / 1e6, 2) + " M"; }

std::string window_text(const ModelSpec& m) {
  if (m.sliding_window <= 0) return "";
  return ", sliding window " + std::to_string(m.sliding_window) +
         (m.full_attention_every > 0 ? " on all but one layer in " + std::to_string(m.full_attention_every) : "");
}

std::string attention_text(const ModelSpec& m) {
  if (m.is_mla())
    return "mla: " + std::to_string(m.heads) + " heads, q latent " + std::to_string(m.mla.q_lora_rank) + ", kv latent " +
           std::to_string(m.mla.kv_lora_rank) + ", qk head " + std::to_string(m.mla.qk_nope_head_dim) + "+" +
           std::to_string(m.mla.qk_rope_head_dim) + " rope, v head " + std::to_string(m.mla.v_head_dim);
  return std::string(to_string(m.attention)) + ": " + std::to_string(m.heads) + " heads, " + std::to_string(m.kv_heads) +
         " kv heads, head_dim " + std::to_string(m.head_dim()) + (m.qkv_bias || m.linear_bias ? ", qkv bias" : "") +
         (m.rotary_dim > 0 ? ", rotary on " + std::to_string(m.rotary_dim) + " (theta " + fixed(m.rope_theta, 0) + ")"
                            : ", no rotary") +
         (m.yarn_factor > 0 ? ", yarn x" + fixed(m.yarn_factor, 0) + " (attention factor " + fixed(m.rope_attention_factor, 3) +
                                  (m.rope_unfused() ? ": Megatron-Core's RoPE runs unfused)" : ")")
                            : "") +
         (m.qk_norm == QkNorm::none ? "" : std::string(", q/k norm per ") + (m.qk_norm == QkNorm::head ? "head" : "projection")) +
         window_text(m);
}

std::string routing_text(const ModelSpec& m) {
  const MoeSpec& e = m.moe;
  std::string r = std::to_string(e.experts) + " routed experts of width " + std::to_string(m.expert_ffn()) + ", top-" +
                  std::to_string(e.top_k) + " by " + to_string(e.router);
  if (e.router != Router::topk_softmax && e.normalize_topk) r += " (renormalized)";
  if (e.routed_scaling != 1.0) r += ", scaled " + fixed(e.routed_scaling, 2);
  if (e.group_limited()) r += ", within " + std::to_string(e.topk_groups) + " of " + std::to_string(e.groups) + " groups";
  return r;
}

nlohmann::json summary_json(const ModelSpec& m, const ModelSummary& s, int seq) {
  nlohmann::json j;
  j["name"] = m.name;
  j["source"] = m.source;
  j["layers"] = m.layers;
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  j["kv_heads"] = m.kv_heads;
  j["head_dim"] = m.head_dim();
  j["rotary_dim"] = m.rotary_dim;
  if (m.rotary_dim > 0) j["rope_theta"] = m.rope_theta;
  if (m.activation_clamp > 0) j["activation_clamp"] = m.activation_clamp;
  if (m.yarn_factor > 0) {
    j["yarn_factor"] = m.yarn_factor;
    j["rope_attention_factor"] = m.rope_attention_factor;
  }
  j["qk_norm"] = to_string(m.qk_norm);
  j["attention"] = to_string(m.attention);
  j["sliding_window"] = m.sliding_window;
  j["full_attention_every"] = m.full_attention_every;
  if (m.is_mla())
    j["mla"] = {{"q_lora_rank", m.mla.q_lora_rank}, {"kv_lora_rank", m.mla.kv_lora_rank},
                {"qk_nope_head_dim", m.mla.qk_nope_head_dim}, {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                {"v_head_dim", m.mla.v_head_dim}};
  j["norm"] = to_string(m.norm);
  j["ffn"] = m.ffn;
  j["vocab"] = m.vocab;
  j["tie_embeddings"] = m.tie_embeddings;
  j["seq_len"] = seq;
  j["layer_pattern"] = m.layer_pattern();
  std::string per_layer;
  for (int i = 0; i < m.layers; ++i) per_layer += m.is_moe_layer(i) ? 'M' : 'D';
  j["layer_kinds"] = per_layer;
  if (m.is_moe()) {
    const MoeSpec& e = m.moe;
    j["moe"] = {{"experts", e.experts}, {"expert_ffn", m.expert_ffn()}, {"top_k", e.top_k}, {"router", to_string(e.router)},
                {"normalize_topk", e.normalize_topk}, {"routed_scaling", e.routed_scaling}, {"groups", e.groups},
                {"topk_groups", e.topk_groups}, {"shared_experts", e.shared_experts}, {"shared_ffn", m.shared_ffn()},
                {"dropless", e.dropless()}, {"capacity_factor", e.capacity_factor}, {"imbalance", e.imbalance}};
  }
  j["total_params"] = s.total_params;
  j["active_params"] = s.active_params;
  j["mtp_layers"] = m.mtp_layers;
  j["mtp_params"] = m.mtp_nonexpert_params() + m.mtp_expert_params();  // beside total_params, not in it
  j["active_params_without_input_embedding"] = s.active_params_without_input_embedding;
  j["embedding_params"] = s.embedding_params;
  j["forward_flops_per_token"] = s.forward_flops_per_token;
  j["head_forward_flops_per_token"] = s.head_forward_flops_per_token;
  nlohmann::json kinds = nlohmann::json::array();
  for (const LayerKindSummary& k : s.kinds)
    kinds.push_back({{"kind", k.kind}, {"layers", k.count}, {"params_per_layer", k.params},
                     {"active_params_per_layer", k.active_params}, {"forward_flops_per_token_per_layer", k.forward_flops_per_token}});
  j["layer_kind_summary"] = kinds;
  j["ignored_keys"] = m.ignored_keys;
  j["approximations"] = m.approximations;
  return j;
}

int run_model_show(const ModelShowOptions& o) {
  const std::string file = resolve_data_file("models", o.model);
  const ModelSpec m = load_model(file);
  const int seq = o.seq_len > 0 ? o.seq_len : m.seq_len;
  const ModelSummary s = summarize_model(m, seq);
  std::ostream& out = o.json == "-" ? std::cerr : std::cout;
  TextTable t({"model", m.name});
  t.align_left();
  t.add_row({"read from", file});
  if (!m.source.empty()) t.add_row({"source", m.source});
  t.add_row({"shape", std::to_string(m.layers) + " layers, hidden " + std::to_string(m.hidden) + ", vocab " +
                          std::to_string(m.vocab) + (m.tie_embeddings ? " (tied)" : " (untied)") + ", " +
                          to_string(m.norm) + ", seq " + std::to_string(seq) + ", " + to_string(m.dtype)});
  t.add_row({"attention", attention_text(m)});
  t.add_row({"dense MLP", "width " + std::to_string(m.ffn) + " " + to_string(m.activation) +
                             (m.activation_clamp > 0 ? ", halves clamped at " + fixed(m.activation_clamp, 1) +
                                                           " (outside Megatron-Core's fused GLU)"
                                                     : "")});
  t.add_row({"layers", m.layer_pattern()});
  if (m.is_moe()) {
    t.add_row({"routing", routing_text(m)});
    if (m.moe.shared_experts > 0)
      t.add_row({"shared", std::to_string(m.moe.shared_experts) + " shared expert(s) of width " + std::to_string(m.shared_ffn()) +
                               (m.moe.shared_gate ? ", sigmoid-gated" : "")});
    t.add_row({"dispatch", m.moe.dropless() ? "dropless, busiest expert " + fixed(m.moe.imbalance, 2) + "x the mean"
                                            : "capacity factor " + fixed(m.moe.capacity_factor, 2) + ", min capacity " +
                                                  std::to_string(m.moe.min_capacity)});
  }
  t.add_row({"total params", billions(s.total_params)});
  if (m.mtp_layers > 0)
    t.add_row({"mtp", std::to_string(m.mtp_layers) + " multi-token-prediction module(s), " +
                          billions(m.mtp_nonexpert_params() + m.mtp_expert_params()) +
                          " params beside the total (eh_proj, norms and a layer each; priced on the last stage)"});
  t.add_row({"active params", billions(s.active_params) + " per token (" + billions(s.active_params_without_input_embedding) +
                                  " without the input embedding)"});
  t.add_row({"forward FLOPs", fixed(s.forward_flops_per_token / 1e9, 2) + " GFLOP per token at seq " + std::to_string(seq)});
  t.print(out);
  out << '\n';
  TextTable k({"layer kind", "layers", "params/layer", "active/layer", "fwd GFLOP/token/layer"});
  for (const LayerKindSummary& l : s.kinds)
    k.add_row({l.kind + " (" + to_string(m.attention) + ")", std::to_string(l.count), millions(l.params), millions(l.active_params),
               fixed(l.forward_flops_per_token / 1e9, 3)});
  k.add_row({"embedding + head", "", millions(s.embedding_params), millions(s.embedding_params),
             fixed(s.head_forward_flops_per_token / 1e9, 3)});
  k.print(out);
  if (!m.approximations.empty()) {
    out << "\ncosted more simply than the config says:\n";
    for (const std::string& a : m.approximations) out << "  " << a << '\n';
  }
  if (!m.ignored_keys.empty()) {
    out << "\nkeys read and ignored (no effect on training cost):";
    for (const std::string& key : m.ignored_keys) out << ' ' << key;
    out << '\n';
  }
  if (!o.json.empty()) write_json(o.json, summary_json(m, s, seq));
  return 0;
}

}  // namespace

void register_model(CLI::App& app, Action& action) {
  CLI::App* model = app.add_subcommand("model", "inspect a model: shape, layer pattern, parameters, FLOPs");
  model->require_subcommand(1);
  auto o = std::make_shared<ModelShowOptions>();
  CLI::App* show = model->add_subcommand("show", "what tedsim reads a model as: shape, layers, routing, total and active parameters");
  show->add_option("model", o->model, "shipped model name (e.g. mixtral-8x7b, hf/deepseek-v3), a model YAML, or a Hugging Face config.json or its folder")
      ->required();
  show->add_option("--json", o->json, "write JSON to FILE, or - for stdout (the table then goes to stderr)");
  show->add_option("--seq", o->seq_len, "sequence length for FLOPs per token (default: the model's; 4096 for Hugging Face configs)")
      ->check(CLI::PositiveNumber);
  show->callback([o, &action] { action = [o] { return run_model_show(*o); }; });
}

}  // namespace tedsim::cli
