#include "tedsim/spec/model_spec.hpp"

#include "tedsim/core/error.hpp"
#include "tedsim/core/yaml_reader.hpp"

namespace tedsim {

const char* to_string(Activation a) { return a == Activation::gelu ? "gelu" : "swiglu"; }

double ModelSpec::attention_params() const {
  const double h = hidden;
  return h * (h + 2.0 * kv_dim()) + h * h;
}

double ModelSpec::mlp_params() const {
  const double matrices = activation == Activation::swiglu ? 3.0 : 2.0;
  return matrices * double(hidden) * double(ffn);
}

double ModelSpec::nonexpert_params() const {
  const double h = hidden;
  const double embeddings = double(vocab) * h * (tie_embeddings ? 1.0 : 2.0);
  const double norms = 2.0 * 2.0 * h;  // two layernorms (gain and bias) per layer
  double total = embeddings + 2.0 * h;  // final layernorm
  total += double(layers) * (attention_params() + norms);
  total += double(dense_layers()) * mlp_params();
  total += double(moe_layers()) * h * double(moe.experts);  // gate weights
  return total;
}

double ModelSpec::expert_params() const {
  return double(moe_layers()) * double(moe.experts) * mlp_params();
}

void ModelSpec::set_experts(int experts) {
  if (experts < 0) throw InputError("--experts: expected a non-negative count, got " + std::to_string(experts));
  moe.experts = experts;
  if (experts > 0 && moe.top_k > experts) moe.top_k = experts;
  validate("--experts " + std::to_string(experts));
}

void ModelSpec::validate(const std::string& origin) const {
  auto bad = [&](const std::string& what) { throw InputError(origin + ": model '" + name + "': " + what); };
  if (hidden % heads != 0) bad("heads (" + std::to_string(heads) + ") must divide hidden (" + std::to_string(hidden) + ")");
  if (heads % kv_heads != 0) bad("kv_heads (" + std::to_string(kv_heads) + ") must divide heads (" + std::to_string(heads) + ")");
  if (is_moe()) {
    if (moe.top_k > moe.experts) bad("moe.top_k (" + std::to_string(moe.top_k) + ") exceeds moe.experts (" + std::to_string(moe.experts) + ")");
    if (moe.every > layers) bad("moe.every (" + std::to_string(moe.every) + ") exceeds layers (" + std::to_string(layers) + ")");
  }
}

ModelSpec load_model(const std::string& path) {
  const YamlMap root = YamlMap::load_file(path);
  ModelSpec m;
  m.name = root.text("name");
  m.source = root.text("source", "");
  m.layers = int(root.positive_integer("layers"));
  m.hidden = int(root.positive_integer("hidden"));
  m.heads = int(root.positive_integer("heads"));
  m.kv_heads = int(root.positive_integer("kv_heads", m.heads));
  m.ffn = int(root.positive_integer("ffn", 4 * std::int64_t(m.hidden)));
  const std::string activation = root.text("activation", "gelu");
  if (activation == "gelu") m.activation = Activation::gelu;
  else if (activation == "swiglu") m.activation = Activation::swiglu;
  else root.fail("activation", "expected gelu or swiglu, got '" + activation + "'");
  m.vocab = int(root.positive_integer("vocab"));
  m.seq_len = int(root.positive_integer("seq_len"));
  try {
    m.dtype = parse_dtype(root.text("dtype", "bf16"));
  } catch (const InputError& e) {
    root.fail("dtype", e.what());
  }
  m.tie_embeddings = root.boolean("tie_embeddings", true);
  if (root.has("moe")) {
    const YamlMap moe = root.child("moe");
    m.moe.experts = int(moe.integer("experts"));
    if (m.moe.experts < 0) moe.fail("experts", "expected a non-negative count (0 = dense)");
    m.moe.every = int(moe.positive_integer("every", 2));
    m.moe.top_k = int(moe.positive_integer("top_k", 1));
    if (m.moe.top_k > 8) moe.fail("top_k", "expected at most 8");
    m.moe.capacity_factor = moe.positive_number("capacity_factor");
    m.moe.min_capacity = int(moe.integer("min_capacity", 4));
    if (m.moe.min_capacity < 0) moe.fail("min_capacity", "expected a non-negative count");
    moe.reject_unknown_keys();
  } else {
    m.moe.experts = 0;
  }
  root.reject_unknown_keys();
  if (m.hidden % m.heads != 0) root.fail("heads", "must divide hidden (" + std::to_string(m.hidden) + ")");
  if (m.heads % m.kv_heads != 0) root.fail("kv_heads", "must divide heads (" + std::to_string(m.heads) + ")");
  m.validate(path);
  return m;
}

}  // namespace tedsim
