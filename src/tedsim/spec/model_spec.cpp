#include "tedsim/spec/model_spec.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "tedsim/core/error.hpp"
#include "tedsim/spec/hf_config.hpp"

namespace tedsim {

const char* to_string(Activation a) { return a == Activation::gelu ? "gelu" : "swiglu"; }

const char* to_string(Router r) {
  switch (r) {
    case Router::softmax_topk: return "softmax_topk";
    case Router::topk_softmax: return "topk_softmax";
    case Router::sigmoid: return "sigmoid";
  }
  return "?";
}

const char* to_string(Attention a) {
  switch (a) {
    case Attention::mha: return "mha";
    case Attention::gqa: return "gqa";
    case Attention::mla: return "mla";
  }
  return "?";
}

const char* to_string(Norm n) { return n == Norm::layernorm ? "layernorm" : "rmsnorm"; }

const char* to_string(QkNorm n) {
  switch (n) {
    case QkNorm::none: return "none";
    case QkNorm::head: return "head";
    case QkNorm::projection: return "projection";
  }
  return "?";
}

double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  const auto get_mscale = [factor](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (mscale != 0 && mscale_all_dim != 0) return get_mscale(mscale) / get_mscale(mscale_all_dim);
  return get_mscale(1.0);
}

bool ModelSpec::is_moe_layer(int layer) const {
  if (!is_moe()) return false;
  if (!moe.layers.empty()) return std::binary_search(moe.layers.begin(), moe.layers.end(), layer);
  if (layer < moe.first_dense) return false;
  return (layer - moe.first_dense) % moe.every == moe.every - 1;
}

int ModelSpec::moe_layers() const {
  if (!is_moe()) return 0;
  if (!moe.layers.empty()) return int(moe.layers.size());
  return std::max(0, layers - moe.first_dense) / moe.every;
}

std::string ModelSpec::layer_pattern() const {
  if (!is_moe()) return std::to_string(layers) + " dense";
  const int n_moe = moe_layers();
  if (n_moe == layers) return std::to_string(layers) + " MoE";
  // A dense prefix then all MoE, or a strict alternation: say it in words; otherwise spell it out.
  int first_moe = 0;
  while (!is_moe_layer(first_moe)) ++first_moe;
  if (first_moe + n_moe == layers)
    return std::to_string(first_moe) + " dense, then " + std::to_string(n_moe) + " MoE";
  std::string s;
  for (int i = 0; i < layers; ++i) s += is_moe_layer(i) ? 'M' : 'D';
  return s + " (D dense, M MoE)";
}

double ModelSpec::norm_params() const { return norm == Norm::layernorm ? 2.0 * hidden : double(hidden); }

double ModelSpec::attention_params() const {
  const double h = hidden;
  if (is_mla()) {
    const double qk = double(heads) * mla.qk_head_dim();
    const double q = mla.q_lora_rank > 0 ? h * mla.q_lora_rank + mla.q_lora_rank + double(mla.q_lora_rank) * qk : h * qk;
    const double kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank +
                      double(mla.kv_lora_rank) * heads * (mla.qk_nope_head_dim + mla.v_head_dim);
    const double out = double(heads) * mla.v_head_dim * h;
    return q + kv + out + (linear_bias ? h : 0.0);
  }
  const double qkv_out = double(q_dim()) + 2.0 * kv_dim();
  const double biases = (linear_bias || qkv_bias ? qkv_out : 0.0) + (linear_bias ? h : 0.0);
  return h * qkv_out + double(q_dim()) * h + biases;
}

double ModelSpec::mlp_params(int width) const {
  const double fc1 = activation == Activation::swiglu ? 2.0 : 1.0;
  const double biases = linear_bias ? fc1 * width + hidden : 0.0;
  return (fc1 + 1.0) * double(hidden) * double(width) + biases;
}

double ModelSpec::router_params() const {
  if (!is_moe()) return 0;
  double p = double(hidden) * moe.experts;
  // Sigmoid routing keeps a per-expert bias for load balancing (DeepSeek-V3's e_score_correction).
  if (linear_bias || moe.router == Router::sigmoid) p += moe.experts;
  if (moe.shared_gate) p += hidden;
  return p;
}

double ModelSpec::shared_expert_params() const {
  return moe.shared_experts > 0 ? double(moe.shared_experts) * mlp_params(shared_ffn()) : 0.0;
}

double ModelSpec::embedding_params() const { return double(vocab) * hidden * (tie_embeddings ? 1.0 : 2.0); }

double ModelSpec::nonexpert_params() const {
  double total = embedding_params() + norm_params();  // final norm
  total += double(layers) * (attention_params() + 2.0 * norm_params());
  total += double(dense_layers()) * mlp_params();
  total += double(moe_layers()) * (router_params() + shared_expert_params());
  return total;
}

double ModelSpec::expert_params() const {
  return double(moe_layers()) * double(moe.experts) * mlp_params(expert_ffn());
}

double ModelSpec::mtp_nonexpert_params() const {
  if (mtp_layers == 0) return 0;
  const bool moe_last = is_moe_layer(layers - 1);
  const double layer = attention_params() + 2.0 * norm_params() +
                       (moe_last ? router_params() + shared_expert_params() : mlp_params());
  // eh_proj [2h, h], the norms of the embedding and of the hidden state, the module's final norm.
  return double(mtp_layers) * (2.0 * double(hidden) * hidden + 3.0 * norm_params() + layer);
}

double ModelSpec::mtp_expert_params() const {
  return mtp_layers > 0 && is_moe_layer(layers - 1) ? double(mtp_layers) * moe.experts * mlp_params(expert_ffn()) : 0.0;
}

double ModelSpec::active_params() const {
  return total_params() - double(moe_layers()) * double(moe.experts - moe.top_k) * mlp_params(expert_ffn());
}

void ModelSpec::set_experts(int experts) {
  if (experts < 0) throw InputError("--experts: expected a non-negative count, got " + std::to_string(experts));
  moe.experts = experts;
  if (experts > 0 && moe.top_k > experts) moe.top_k = experts;
  if (experts > 0 && moe.groups > 1 && experts % moe.groups != 0) moe.groups = moe.topk_groups = 1;
  validate("--experts " + std::to_string(experts));
}

void ModelSpec::validate(const std::string& origin) const {
  auto bad = [&](const std::string& what) { throw InputError(origin + ": model '" + name + "': " + what); };
  auto num = [](double v) { return std::to_string(int(v)); };
  if (head_dim_given == 0 && !is_mla() && hidden % heads != 0)
    bad("heads (" + num(heads) + ") must divide hidden (" + num(hidden) + "), or give head_dim");
  if (heads % kv_heads != 0) bad("kv_heads (" + num(kv_heads) + ") must divide heads (" + num(heads) + ")");
  if (is_mla() && (mla.kv_lora_rank <= 0 || mla.qk_nope_head_dim <= 0 || mla.qk_rope_head_dim <= 0 || mla.v_head_dim <= 0))
    bad("attention: mla needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim > 0");
  if (is_moe()) {
    if (moe.top_k > moe.experts) bad("moe.top_k (" + num(moe.top_k) + ") exceeds moe.experts (" + num(moe.experts) + ")");
    if (moe.layers.empty()) {
      if (moe.every > layers) bad("moe.every (" + num(moe.every) + ") exceeds layers (" + num(layers) + ")");
      if (moe.first_dense >= layers) bad("moe.first_dense (" + num(moe.first_dense) + ") leaves no layer (of " + num(layers) + ") for experts");
      if (moe_layers() == 0) bad("moe.every and moe.first_dense leave no MoE layer");
    }
    for (int l : moe.layers)
      if (l < 0 || l >= layers) bad("moe.layers: layer " + num(l) + " is outside 0.." + num(layers - 1));
    if (moe.groups > 1) {
      if (moe.experts % moe.groups != 0) bad("moe.groups (" + num(moe.groups) + ") must divide moe.experts (" + num(moe.experts) + ")");
      if (moe.topk_groups > moe.groups) bad("moe.topk_groups (" + num(moe.topk_groups) + ") exceeds moe.groups (" + num(moe.groups) + ")");
      if (double(moe.topk_groups) * (moe.experts / moe.groups) < moe.top_k)
        bad("moe.topk_groups (" + num(moe.topk_groups) + ") groups of " + num(moe.experts / moe.groups) +
            " experts cannot hold top_k (" + num(moe.top_k) + ") experts");
    }
    if (moe.imbalance < 1.0) bad("moe.imbalance must be at least 1 (the busiest expert over the mean)");
  }
}

ModelSpec load_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path config = fs::path(path) / "config.json";
    if (!fs::exists(config, ec))
      throw InputError(path + ": a folder given as the model must hold a Hugging Face config.json");
    return load_hf_config(config.string());
  }
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return load_hf_config(path);
  return load_model_yaml(path);
}

}  // namespace tedsim
