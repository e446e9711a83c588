#include "tedsim/spec/hf_config.hpp"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

using nlohmann::json;

// Keys that do not change what a training step computes or moves: token ids, initialisation,
// numerics of norms, rotary embeddings' frequency scaling, inference caching, the checkpoint's storage format,
// the auxiliary losses' weights (their cost is a few reductions over the router's output).
const char* const kIgnoredKeys[] = {
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "rms_norm_eps", "layer_norm_eps",
    "rope_scaling", "rope_parameters", "max_position_embeddings",
    "initial_context_length", "use_cache", "attention_dropout", "hidden_dropout", "output_router_logits",
    "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "router_jitter_noise", "pretraining_tp",
    "quantization_config", "auto_map", "id2label", "label2id", "tokenizer_class", "ep_size",
    "clip_qkv", "max_window_layers", "qk_layernorm",
    "use_qk_norm", "return_dict", "_attn_implementation", "bias_correction",
};

class HfReader {
 public:
  HfReader(const json& root, std::string file) : root_(root), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InputError(file_ + ": key '" + key + "': " + what);
  }
  bool has(const std::string& key) {
    read_.insert(key);
    return root_.contains(key) && !root_.at(key).is_null();
  }
  std::int64_t integer(const std::string& key) {
    if (!has(key)) fail(key, "missing (required for " + arch_ + ")");
    const json& v = root_.at(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    return v.get<std::int64_t>();
  }
  std::int64_t positive(const std::string& key) {
    const std::int64_t x = integer(key);
    if (x <= 0) fail(key, "expected a positive integer, got " + std::to_string(x));
    if (x > (std::int64_t(1) << 30)) fail(key, "expected a size below 2^30, got " + std::to_string(x));
    return x;
  }
  std::int64_t positive(const std::string& key, std::int64_t fallback) { return has(key) ? positive(key) : fallback; }
  std::int64_t nonnegative(const std::string& key, std::int64_t fallback) {
    if (!has(key)) return fallback;
    const std::int64_t x = integer(key);
    if (x < 0) fail(key, "expected a non-negative integer, got " + std::to_string(x));
    return x;
  }
  double number(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  // `inner` of the object at `key` (transformers 5 nests RoPE's settings in rope_parameters).
  double nested_number(const std::string& key, const std::string& inner, double fallback) {
    if (!has(key) || !root_.at(key).is_object() || !root_.at(key).contains(inner)) return fallback;
    const json& v = root_.at(key).at(inner);
    if (!v.is_number()) fail(key + "." + inner, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::vector<int> integer_list(const std::string& key) {
    if (!has(key)) return {};
    const json& v = root_.at(key);
    if (!v.is_array()) fail(key, "expected a list of layer indices, got " + v.dump());
    std::vector<int> out;
    for (const json& x : v) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < 0) fail(key, "expected non-negative layer indices, got " + x.dump());
      out.push_back(x.get<int>());
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  // The value at `key` without counting it read (nullptr: absent or null).
  const json* peek(const std::string& key) const {
    return root_.contains(key) && !root_.at(key).is_null() ? &root_.at(key) : nullptr;
  }
  const json& raw(const std::string& key) {
    read_.insert(key);
    return root_.at(key);
  }
  void set_architecture(const std::string& a) { arch_ = a; }

  // Every key neither read nor known to be irrelevant would change the shape unseen: an error.
  std::vector<std::string> finish() {
    std::vector<std::string> ignored;
    for (const auto& [key, value] : root_.items()) {
      if (read_.count(key)) continue;
      if (std::find(std::begin(kIgnoredKeys), std::end(kIgnoredKeys), key) != std::end(kIgnoredKeys)) {
        ignored.push_back(key);
        continue;
      }
      fail(key, "not understood for " + arch_ +
                    "; it may change the model's shape, so tedsim will not guess (remove it if it does not)");
    }
    return ignored;
  }

 private:
  const json& root_;
  std::string file_;
  std::string arch_ = "this architecture";
  std::set<std::string> read_;
};

enum class Family { llama, qwen2, qwen3, mistral, mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, olmoe, gpt_oss };

struct Architecture {
  const char* name;
  Family family;
};

const Architecture kArchitectures[] = {
    {"LlamaForCausalLM", Family::llama},          {"Qwen2ForCausalLM", Family::qwen2},
    {"Qwen3ForCausalLM", Family::qwen3},          {"MistralForCausalLM", Family::mistral},
    {"MixtralForCausalLM", Family::mixtral},      {"Qwen2MoeForCausalLM", Family::qwen2_moe},
    {"Qwen3MoeForCausalLM", Family::qwen3_moe},   {"DeepseekV2ForCausalLM", Family::deepseek_v2},
    {"DeepseekV3ForCausalLM", Family::deepseek_v3}, {"OlmoeForCausalLM", Family::olmoe},
    {"GptOssForCausalLM", Family::gpt_oss},
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

json parse_text(const std::string& text, const std::string& path) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) throw InputError(path + ": expected a JSON object (a Hugging Face config.json)");
    return j;
  } catch (const json::parse_error& e) {
    throw InputError(path + ": malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {  // a number out of range (1e9999)
    throw InputError(path + ": malformed JSON: " + e.what());
  }
}

Family read_architecture(HfReader& r, const json& root) {
  if (!root.contains("architectures"))
    r.fail("architectures", "missing: tedsim needs it to know how to read the config (one of the supported list in README)");
  const json& a = r.raw("architectures");
  if (!a.is_array() || a.size() != 1 || !a[0].is_string())
    r.fail("architectures", "expected a list of one architecture name, got " + a.dump());
  const std::string name = a[0].get<std::string>();
  for (const Architecture& arch : kArchitectures)
    if (name == arch.name) {
      r.set_architecture(name);
      return arch.family;
    }
  std::string known;
  for (const Architecture& arch : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(arch.name);
  r.fail("architectures", "'" + name + "' is not an architecture tedsim reads; it reads " + known);
}

bool is_moe_family(Family f) {
  return f == Family::mixtral || f == Family::qwen2_moe || f == Family::qwen3_moe || f == Family::deepseek_v2 ||
         f == Family::deepseek_v3 || f == Family::olmoe || f == Family::gpt_oss;
}

// The gated MLP every one of these architectures uses; the activation inside the gate (SiLU,
// GeLU) costs the same, so any of these reads as tedsim's swiglu.
void read_activation(HfReader& r, ModelSpec& m) {
  const std::string act = r.text("hidden_act", "silu");
  static const char* const gated[] = {"silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu"};
  if (std::find(std::begin(gated), std::end(gated), act) == std::end(gated))
    r.fail("hidden_act", "expected one of silu, swish, gelu, gelu_new, gelu_pytorch_tanh, relu, got '" + act + "'");
  m.activation = Activation::swiglu;
}

void read_attention(HfReader& r, Family f, ModelSpec& m) {
  m.heads = int(r.positive("num_attention_heads"));
  m.kv_heads = int(r.positive("num_key_value_heads", m.heads));
  if (m.heads % m.kv_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(m.heads) + "), got " + std::to_string(m.kv_heads));
  if (f == Family::deepseek_v2 || f == Family::deepseek_v3) {
    m.attention = Attention::mla;
    m.mla.q_lora_rank = int(r.nonnegative("q_lora_rank", 0));  // null in V2-Lite: no query latent
    m.mla.kv_lora_rank = int(r.positive("kv_lora_rank"));
    m.mla.qk_nope_head_dim = int(r.positive("qk_nope_head_dim"));
    m.mla.qk_rope_head_dim = int(r.positive("qk_rope_head_dim"));
    m.mla.v_head_dim = int(r.positive("v_head_dim"));
    m.qkv_bias = m.linear_bias = r.boolean("attention_bias", false);
    if (r.has("head_dim")) r.positive("head_dim");  // MLA's head sizes are the ranks above
    m.rotary_dim = m.mla.qk_rope_head_dim;  // MLA rotates the decoupled rope part only
    return;
  }
  m.attention = m.kv_heads == m.heads ? Attention::mha : Attention::gqa;
  if (r.has("head_dim")) m.head_dim_given = int(r.positive("head_dim"));
  else if (m.hidden % m.heads != 0)
    r.fail("head_dim", "missing, and num_attention_heads (" + std::to_string(m.heads) + ") does not divide hidden_size");
  // Every architecture read here uses rotary position embeddings (the rope_* keys set only its
  // frequencies); partial_rotary_factor rotates that share of each head.
  const double rotary_share = r.number("partial_rotary_factor", 1.0);
  if (!(rotary_share > 0 && rotary_share <= 1)) r.fail("partial_rotary_factor", "expected a share in (0, 1]");
  m.rotary_dim = int(rotary_share * m.head_dim());
  if (m.rotary_dim % 2 != 0)
    r.fail("partial_rotary_factor", "rotates " + std::to_string(m.rotary_dim) + " of head_dim " +
                                        std::to_string(m.head_dim()) + ", an odd count (RoPE rotates pairs)");
  // Qwen2 / Qwen2-MoE put biases on q, k, v always; the others say so with attention_bias.
  if (f == Family::qwen2 || f == Family::qwen2_moe) m.qkv_bias = true;
  else if (f == Family::gpt_oss) m.linear_bias = r.boolean("attention_bias", true);
  else if (r.boolean("attention_bias", false)) m.qkv_bias = m.linear_bias = true;
  if (f == Family::llama && r.boolean("mlp_bias", false)) m.linear_bias = true;
  // Sliding-window attention: on every layer (Mistral), or on the layers layer_types marks
  // sliding (gpt-oss: every other one, Megatron-Core's window_attn_skip_freq 2).
  const bool window_used = f == Family::mistral || f == Family::gpt_oss ? r.has("sliding_window")
                                                                       : r.boolean("use_sliding_window", false);
  std::vector<bool> sliding;
  if (r.has("layer_types")) {
    const json& lt = r.raw("layer_types");
    if (!lt.is_array()) r.fail("layer_types", "expected a list of attention kinds per layer");
    for (const json& k : lt) {
      if (!k.is_string() || (k != "full_attention" && k != "sliding_attention"))
        r.fail("layer_types", "expected full_attention or sliding_attention, got " + k.dump());
      sliding.push_back(k == "sliding_attention");
    }
    if (int(sliding.size()) != m.layers)
      r.fail("layer_types", "expected one entry per layer (" + std::to_string(m.layers) + "), got " +
                                std::to_string(sliding.size()));
  }
  if (r.has("sliding_window") && window_used && !r.raw("sliding_window").is_null()) {
    const int w = int(r.positive("sliding_window"));
    const bool any = sliding.empty() || std::find(sliding.begin(), sliding.end(), true) != sliding.end();
    if (any) m.sliding_window = w;
    if (any && !sliding.empty() && std::find(sliding.begin(), sliding.end(), false) != sliding.end()) {
      // Every k-th layer (1-based) full, the rest windowed: the one pattern besides "all".
      int every = 0;
      for (int k = 2; k <= m.layers && every == 0; ++k) {
        bool fits = true;
        for (int i = 0; i < m.layers && fits; ++i) fits = sliding[std::size_t(i)] == ((i + 1) % k != 0);
        if (fits) every = k;
      }
      if (every == 0)
        r.fail("layer_types", "a pattern tedsim cannot express: it windows every layer, or all but every k-th");
      m.full_attention_every = every;
    }
  }
  r.has("use_sliding_window");
}

// YaRN's frequency scaling (rope_scaling, or transformers 5's rope_parameters, of rope_type or
// type yarn): its factor, and the attention factor given outright or from DeepSeek's mscale /
// mscale_all_dim. Megatron-Core runs RoPE unfused when that factor is not 1, so it is a cost
// (ModelSpec::rope_attention_factor). Other scalings (llama3, linear, ...) only change the
// frequencies: their key stays listed as ignored.
void read_rope_scaling(HfReader& r, ModelSpec& m) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = r.peek(key);
    if (v == nullptr || !v->is_object()) continue;
    const auto text = [&](const char* inner) -> std::string {
      if (!v->contains(inner)) return "";
      if (!v->at(inner).is_string()) r.fail(std::string(key) + "." + inner, "expected a string, got " + v->at(inner).dump());
      return v->at(inner).get<std::string>();
    };
    const std::string type = !text("rope_type").empty() ? text("rope_type") : text("type");
    if (type != "yarn") continue;
    r.raw(key);
    const auto number = [&](const char* inner) -> double {
      if (!v->contains(inner) || v->at(inner).is_null()) return 0.0;
      const json& x = v->at(inner);
      if (!x.is_number() || x.get<double>() < 0)
        r.fail(std::string(key) + "." + inner, "expected a non-negative number, got " + x.dump());
      return x.get<double>();
    };
    m.yarn_factor = number("factor");
    if (!(m.yarn_factor > 0)) r.fail(std::string(key) + ".factor", "yarn needs a positive scaling factor");
    const double given = number("attention_factor");
    m.rope_attention_factor = given > 0 ? given : yarn_attention_factor(m.yarn_factor, number("mscale"), number("mscale_all_dim"));
    return;
  }
}

void read_moe(HfReader& r, Family f, ModelSpec& m) {
  MoeSpec& e = m.moe;
  e.capacity_factor = 0;  // these models train dropless; --capacity-factor sets a capacity
  switch (f) {
    case Family::mixtral:
    case Family::gpt_oss: {
      // Top-k of the logits, then softmax over those k. gpt-oss writes the k under two names.
      e.experts = int(r.positive("num_local_experts"));
      const bool oss_only = f == Family::gpt_oss && !r.has("num_experts_per_tok");
      e.top_k = int(r.positive(oss_only ? "experts_per_token" : "num_experts_per_tok"));
      if (f == Family::gpt_oss && r.has("experts_per_token") && r.positive("experts_per_token") != e.top_k)
        r.fail("experts_per_token", "disagrees with num_experts_per_tok (" + std::to_string(e.top_k) + ")");
      e.ffn = m.ffn;
      e.router = Router::topk_softmax;
      break;
    }
    case Family::olmoe:
      e.experts = int(r.positive("num_experts"));
      e.top_k = int(r.positive("num_experts_per_tok"));
      e.ffn = m.ffn;
      e.normalize_topk = r.boolean("norm_topk_prob", false);
      break;
    case Family::qwen2_moe:
    case Family::qwen3_moe: {
      e.experts = int(r.positive("num_experts"));
      e.top_k = int(r.positive("num_experts_per_tok"));
      e.ffn = int(r.positive("moe_intermediate_size"));
      e.normalize_topk = r.boolean("norm_topk_prob", false);
      const int step = int(r.positive("decoder_sparse_step", 1));
      const std::vector<int> dense_only = r.integer_list("mlp_only_layers");
      // Hugging Face: layer i is sparse when it is not in mlp_only_layers and (i + 1) % step == 0.
      for (int l : dense_only)
        if (l >= m.layers) r.fail("mlp_only_layers", "layer " + std::to_string(l) + " is outside 0.." + std::to_string(m.layers - 1));
      for (int i = 0; i < m.layers; ++i)
        if ((i + 1) % step == 0 && !std::binary_search(dense_only.begin(), dense_only.end(), i)) e.layers.push_back(i);
      if (e.layers.empty()) r.fail("decoder_sparse_step", "with mlp_only_layers, leaves no MoE layer");
      if (f == Family::qwen2_moe) {
        const std::int64_t shared = r.nonnegative("shared_expert_intermediate_size", 0);
        if (shared > 0) {
          e.shared_experts = 1;
          e.shared_ffn = int(shared);
          e.shared_gate = true;
        }
      }
      break;
    }
    case Family::deepseek_v2:
    case Family::deepseek_v3: {
      e.experts = int(r.positive("n_routed_experts"));
      e.top_k = int(r.positive("num_experts_per_tok"));
      e.ffn = int(r.positive("moe_intermediate_size"));
      e.shared_experts = int(r.nonnegative("n_shared_experts", 0));
      e.shared_ffn = e.ffn;
      const int first_dense = int(r.nonnegative("first_k_dense_replace", 0));
      const int freq = int(r.positive("moe_layer_freq", 1));
      // Hugging Face: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0.
      for (int i = first_dense; i < m.layers; ++i)
        if (i % freq == 0) e.layers.push_back(i);
      if (e.layers.empty()) r.fail("first_k_dense_replace", "leaves no MoE layer of " + std::to_string(m.layers));
      const std::string scoring = r.text("scoring_func", "softmax");
      if (scoring == "sigmoid") e.router = Router::sigmoid;
      else if (scoring == "softmax") e.router = Router::softmax_topk;
      else r.fail("scoring_func", "expected softmax or sigmoid, got '" + scoring + "'");
      e.normalize_topk = r.boolean("norm_topk_prob", false);
      e.routed_scaling = r.number("routed_scaling_factor", 1.0);
      if (e.routed_scaling <= 0) r.fail("routed_scaling_factor", "expected a positive number");
      const std::string method = r.text("topk_method", f == Family::deepseek_v3 ? "noaux_tc" : "greedy");
      if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
        r.fail("topk_method", "expected greedy, group_limited_greedy or noaux_tc, got '" + method + "'");
      const int groups = int(r.positive("n_group", 1));
      const int topk_groups = int(r.positive("topk_group", groups));
      if (method != "greedy" && groups > 1) {
        e.groups = groups;
        e.topk_groups = topk_groups;
        if (e.experts % groups != 0) r.fail("n_group", "must divide n_routed_experts (" + std::to_string(e.experts) + ")");
        if (topk_groups > groups) r.fail("topk_group", "exceeds n_group (" + std::to_string(groups) + ")");
      }
      break;
    }
    default: break;
  }
  if (e.top_k > e.experts)
    r.fail("num_experts_per_tok", "(" + std::to_string(e.top_k) + ") exceeds the expert count (" + std::to_string(e.experts) + ")");
  if (e.groups > 1 && double(e.topk_groups) * (e.experts / e.groups) < e.top_k)
    r.fail("topk_group", "groups too few to hold num_experts_per_tok experts");
  e.every = 1;
}

std::string stem_name(const std::string& path) {
  // ".../deepseek-v3/config.json" -> "deepseek-v3"; ".../mixtral.json" -> "mixtral"
  std::string p = path;
  const auto slash = p.find_last_of('/');
  std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  if (base == "config.json" && slash != std::string::npos) {
    const std::string dir = p.substr(0, slash);
    const auto s2 = dir.find_last_of('/');
    return s2 == std::string::npos ? dir : dir.substr(s2 + 1);
  }
  return base.size() > 5 ? base.substr(0, base.size() - 5) : base;
}

}  // namespace

const std::vector<std::string>& hf_architectures() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Architecture& a : kArchitectures) v.emplace_back(a.name);
    return v;
  }();
  return names;
}

HfImport import_hf_config(const std::string& path) { return import_hf_config_text(read_file(path), path); }

HfImport import_hf_config_text(const std::string& text, const std::string& path) {
  const json root = parse_text(text, path);
  HfReader r(root, path);
  HfImport out;
  const Family family = read_architecture(r, root);
  out.architecture = hf_architectures()[std::size_t(std::find_if(std::begin(kArchitectures), std::end(kArchitectures),
                                                                  [&](const Architecture& a) { return a.family == family; }) -
                                                     std::begin(kArchitectures))];
  ModelSpec& m = out.model;
  m.name = stem_name(path);
  m.source = "Hugging Face config " + path + " (" + out.architecture + ")";
  m.layers = int(r.positive("num_hidden_layers"));
  m.hidden = int(r.positive("hidden_size"));
  m.vocab = int(r.positive("vocab_size"));
  m.ffn = int(r.positive("intermediate_size"));
  m.norm = Norm::rmsnorm;
  m.dtype = Dtype::bf16;
  m.seq_len = kHfDefaultSeqLen;
  m.tie_embeddings = r.boolean("tie_word_embeddings", false);
  read_activation(r, m);
  read_attention(r, family, m);
  // The architectures' own q/k norms (no config key says so): Qwen3's per head (q_norm, k_norm over
  // head_dim), OLMoE's over the whole projections.
  if (family == Family::qwen3 || family == Family::qwen3_moe) m.qk_norm = QkNorm::head;
  if (family == Family::olmoe) m.qk_norm = QkNorm::projection;
  // RoPE's base (transformers' default 10000 where the config gives none): the numerics of the
  // training step's rotation, not its cost.
  m.rope_theta = r.number("rope_theta", r.nested_number("rope_parameters", "rope_theta", kDefaultRopeTheta));
  if (!(m.rope_theta > 1)) r.fail("rope_theta", "expected a base above 1, got " + std::to_string(m.rope_theta));
  read_rope_scaling(r, m);
  // gpt-oss's GLU clamp (ModelSpec::activation_clamp).
  m.activation_clamp = r.number("swiglu_limit", 0.0);
  if (m.activation_clamp < 0) r.fail("swiglu_limit", "expected a non-negative limit, got " + std::to_string(m.activation_clamp));
  if (is_moe_family(family)) read_moe(r, family, m);
  m.mtp_layers = int(r.nonnegative("num_nextn_predict_layers", 0));
  out.ignored = r.finish();
  m.ignored_keys = out.ignored;
  m.approximations = out.approximated;
  m.validate(path);
  return out;
}

ModelSpec load_hf_config(const std::string& path) { return import_hf_config(path).model; }

}  // namespace tedsim
