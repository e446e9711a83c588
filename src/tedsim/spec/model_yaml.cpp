// Reads tedsim's own model files (models/*.yaml): every key read or rejected, every value checked.
#include "tedsim/core/error.hpp"
#include "tedsim/core/yaml_reader.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim {
namespace {

template <typename Enum, std::size_t N>
Enum choice(const YamlMap& map, const std::string& key, const std::string& fallback,
            const std::pair<const char*, Enum> (&options)[N]) {
  const std::string text = map.text(key, fallback);
  std::string names;
  for (const auto& [name, value] : options) {
    if (text == name) return value;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  map.fail(key, "expected one of " + names + ", got '" + text + "'");
}

void read_mla(const YamlMap& root, ModelSpec& m) {
  const YamlMap mla = root.child("mla");
  m.mla.q_lora_rank = int(mla.integer("q_lora_rank", 0));
  if (m.mla.q_lora_rank < 0) mla.fail("q_lora_rank", "expected a non-negative rank (0: no query latent)");
  m.mla.kv_lora_rank = int(mla.positive_integer("kv_lora_rank"));
  m.mla.qk_nope_head_dim = int(mla.positive_integer("qk_nope_head_dim"));
  m.mla.qk_rope_head_dim = int(mla.positive_integer("qk_rope_head_dim"));
  m.mla.v_head_dim = int(mla.positive_integer("v_head_dim"));
  mla.reject_unknown_keys();
}

// YaRN's frequency scaling: its factor, and the attention factor given outright or from
// DeepSeek's mscale / mscale_all_dim (yarn_attention_factor).
void read_yarn(const YamlMap& root, ModelSpec& m) {
  if (m.rotary_dim == 0) root.fail("yarn", "given without rotary_dim (no rotary embeddings to scale)");
  const YamlMap yarn = root.child("yarn");
  m.yarn_factor = yarn.positive_number("factor");
  if (yarn.has("attention_factor")) {
    if (yarn.has("mscale") || yarn.has("mscale_all_dim"))
      yarn.fail("attention_factor", "give either attention_factor or mscale/mscale_all_dim, not both");
    m.rope_attention_factor = yarn.positive_number("attention_factor");
  } else {
    const double mscale = yarn.nonnegative_number("mscale", 0.0);
    const double mscale_all_dim = yarn.nonnegative_number("mscale_all_dim", 0.0);
    m.rope_attention_factor = yarn_attention_factor(m.yarn_factor, mscale, mscale_all_dim);
  }
  yarn.reject_unknown_keys();
}

void read_moe(const YamlMap& root, ModelSpec& m) {
  const YamlMap moe = root.child("moe");
  MoeSpec& e = m.moe;
  e.experts = int(moe.integer("experts"));
  if (e.experts < 0) moe.fail("experts", "expected a non-negative count (0 = dense)");
  if (moe.has("layers")) {
    if (moe.has("every") || moe.has("first_dense")) moe.fail("layers", "give either layers or every/first_dense, not both");
    e.layers = moe.increasing_integers("layers");
    for (int l : e.layers)
      if (l >= m.layers) moe.fail("layers", "layer " + std::to_string(l) + " is outside 0.." + std::to_string(m.layers - 1));
  }
  e.every = int(moe.positive_integer("every", 2));
  e.first_dense = int(moe.integer("first_dense", 0));
  if (e.first_dense < 0) moe.fail("first_dense", "expected a non-negative count of leading dense layers");
  e.top_k = int(moe.positive_integer("top_k", 1));
  if (e.experts > 0 && e.top_k > e.experts)
    moe.fail("top_k", "expected at most the expert count (" + std::to_string(e.experts) + "), got " + std::to_string(e.top_k));
  e.capacity_factor = moe.nonnegative_number("capacity_factor", -1.0);
  if (e.capacity_factor < 0) moe.fail("capacity_factor", "missing (required): a capacity factor, or 0 for dropless routing");
  e.min_capacity = int(moe.integer("min_capacity", 4));
  if (e.min_capacity < 0) moe.fail("min_capacity", "expected a non-negative count");
  e.imbalance = moe.nonnegative_number("imbalance", kDefaultImbalance);
  e.imbalance_given = moe.has("imbalance");
  if (e.imbalance < 1.0) moe.fail("imbalance", "expected at least 1 (the busiest expert's tokens over the mean)");
  e.ffn = int(moe.positive_integer("ffn", m.ffn));
  e.shared_experts = int(moe.integer("shared_experts", 0));
  if (e.shared_experts < 0) moe.fail("shared_experts", "expected a non-negative count");
  e.shared_ffn = int(moe.positive_integer("shared_ffn", e.ffn));
  e.shared_gate = moe.boolean("shared_gate", false);
  if (e.shared_gate && e.shared_experts == 0) moe.fail("shared_gate", "needs shared_experts > 0");
  static const std::pair<const char*, Router> routers[] = {
      {"softmax_topk", Router::softmax_topk}, {"topk_softmax", Router::topk_softmax}, {"sigmoid", Router::sigmoid}};
  e.router = choice(moe, "router", "softmax_topk", routers);
  // Defaults: sigmoid scores are renormalized (DeepSeek-V3); softmax-then-top-k renormalizes its k
  // weights for k >= 2, as DeepSpeed's top-2 gating (the TED lineage) does.
  e.normalize_topk = moe.boolean("normalize_topk", e.router == Router::sigmoid || (e.router == Router::softmax_topk && e.top_k > 1));
  if (e.router == Router::topk_softmax && moe.has("normalize_topk"))
    moe.fail("normalize_topk", "topk_softmax weights already sum to 1");
  e.routed_scaling = moe.has("routed_scaling") ? moe.positive_number("routed_scaling") : 1.0;
  e.groups = int(moe.positive_integer("groups", 1));
  e.topk_groups = int(moe.positive_integer("topk_groups", e.groups));
  if (e.topk_groups > e.groups) moe.fail("topk_groups", "expected at most groups (" + std::to_string(e.groups) + ")");
  if (e.groups > 1 && e.experts % e.groups != 0)
    moe.fail("groups", "must divide experts (" + std::to_string(e.experts) + ")");
  moe.reject_unknown_keys();
}

}  // namespace

ModelSpec load_model_yaml(const std::string& path) { return model_from_yaml(YamlMap::load_file(path), path); }

ModelSpec model_from_yaml_text(const std::string& text, const std::string& name) {
  return model_from_yaml(YamlMap::from_string(text, name), name);
}

ModelSpec model_from_yaml(const YamlMap& root, const std::string& path) {
  ModelSpec m;
  m.name = root.text("name");
  m.source = root.text("source", "");
  m.layers = int(root.positive_integer("layers"));
  m.hidden = int(root.positive_integer("hidden"));
  m.heads = int(root.positive_integer("heads"));
  m.kv_heads = int(root.positive_integer("kv_heads", m.heads));
  m.head_dim_given = root.has("head_dim") ? int(root.positive_integer("head_dim")) : 0;
  m.rotary_dim = root.has("rotary_dim") ? int(root.positive_integer("rotary_dim")) : 0;
  if (m.rotary_dim % 2 != 0) root.fail("rotary_dim", "expected an even count (RoPE rotates pairs), got " + std::to_string(m.rotary_dim));
  if (root.has("rope_theta")) {
    if (m.rotary_dim == 0) root.fail("rope_theta", "given without rotary_dim (no rotary embeddings to set the base of)");
    m.rope_theta = root.positive_number("rope_theta");
    if (m.rope_theta <= 1) root.fail("rope_theta", "expected a base above 1, got " + std::to_string(m.rope_theta));
  }
  if (root.has("yarn")) read_yarn(root, m);
  m.sliding_window = root.has("sliding_window") ? int(root.positive_integer("sliding_window")) : 0;
  m.full_attention_every = root.has("full_attention_every") ? int(root.positive_integer("full_attention_every")) : 0;
  if (m.full_attention_every > 0 && m.sliding_window == 0)
    root.fail("full_attention_every", "needs sliding_window (the layers between the full ones are windowed)");
  m.ffn = int(root.positive_integer("ffn", 4 * std::int64_t(m.hidden)));
  static const std::pair<const char*, Activation> activations[] = {{"gelu", Activation::gelu}, {"swiglu", Activation::swiglu}};
  m.activation = choice(root, "activation", "gelu", activations);
  if (root.has("activation_clamp")) {
    if (m.activation != Activation::swiglu) root.fail("activation_clamp", "clamps a GLU's halves: needs activation: swiglu");
    m.activation_clamp = root.positive_number("activation_clamp");
  }
  static const std::pair<const char*, Attention> attentions[] = {
      {"mha", Attention::mha}, {"gqa", Attention::gqa}, {"mla", Attention::mla}};
  m.attention = choice(root, "attention", m.kv_heads == m.heads ? "mha" : "gqa", attentions);
  if (m.attention == Attention::mha && m.kv_heads != m.heads) root.fail("attention", "mha needs kv_heads = heads; use gqa");
  if (m.attention == Attention::mla) read_mla(root, m);
  else if (root.has("mla")) root.fail("mla", "MLA ranks need attention: mla");
  static const std::pair<const char*, Norm> norms[] = {{"layernorm", Norm::layernorm}, {"rmsnorm", Norm::rmsnorm}};
  m.norm = choice(root, "norm", "layernorm", norms);
  static const std::pair<const char*, QkNorm> qk_norms[] = {
      {"none", QkNorm::none}, {"head", QkNorm::head}, {"projection", QkNorm::projection}};
  m.qk_norm = choice(root, "qk_norm", "none", qk_norms);
  if (m.qk_norm != QkNorm::none && m.attention == Attention::mla)
    root.fail("qk_norm", "MLA normalizes its latents, not its queries and keys (give none)");
  m.linear_bias = root.boolean("bias", false);
  m.qkv_bias = root.boolean("qkv_bias", false);
  m.hidden_dropout = root.nonnegative_number("hidden_dropout", 0.0);
  m.attention_dropout = root.nonnegative_number("attention_dropout", 0.0);
  if (m.hidden_dropout >= 1) root.fail("hidden_dropout", "expected a probability in [0, 1)");
  if (m.attention_dropout >= 1) root.fail("attention_dropout", "expected a probability in [0, 1)");
  m.vocab = int(root.positive_integer("vocab"));
  m.seq_len = int(root.positive_integer("seq_len"));
  try {
    m.dtype = parse_dtype(root.text("dtype", "bf16"));
  } catch (const InputError& e) {
    root.fail("dtype", e.what());
  }
  m.tie_embeddings = root.boolean("tie_embeddings", true);
  m.mtp_layers = int(root.integer("mtp_layers", 0));
  if (m.mtp_layers < 0) root.fail("mtp_layers", "expected a non-negative count of multi-token-prediction modules");
  if (root.has("moe")) read_moe(root, m);
  else m.moe.experts = 0;
  root.reject_unknown_keys();
  if (m.head_dim_given == 0 && !m.is_mla() && m.hidden % m.heads != 0)
    root.fail("heads", "must divide hidden (" + std::to_string(m.hidden) + "), or give head_dim");
  if (m.heads % m.kv_heads != 0) root.fail("kv_heads", "must divide heads (" + std::to_string(m.heads) + ")");
  const int rotatable = m.is_mla() ? m.mla.qk_rope_head_dim : m.head_dim();
  if (m.rotary_dim > rotatable)
    root.fail("rotary_dim", "at most the head's " + std::string(m.is_mla() ? "qk_rope_head_dim" : "head_dim") + " (" +
                                std::to_string(rotatable) + "), got " + std::to_string(m.rotary_dim));
  m.validate(path);
  return m;
}

}  // namespace tedsim
