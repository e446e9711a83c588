#pragma once
// A GPT-style decoder with optional Mixture-of-Experts layers, as read from models/*.yaml.
#include <cstdint>
#include <string>

#include "tedsim/core/units.hpp"

namespace tedsim {

enum class Activation { gelu, swiglu };
const char* to_string(Activation a);

struct MoeSpec {
  int experts = 0;             // 0: a dense model
  int every = 2;               // layer i (0-based) is MoE when i % every == every - 1
  int top_k = 1;
  double capacity_factor = 1.0;
  int min_capacity = 4;
};

struct ModelSpec {
  std::string name;
  std::string source;          // where the shape comes from
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;            // grouped-query attention; equals heads for multi-head attention
  int ffn = 0;                 // FFN width F (4h unless the model says)
  Activation activation = Activation::gelu;
  int vocab = 0;
  int seq_len = 0;
  Dtype dtype = Dtype::fp16;
  bool tie_embeddings = true;
  MoeSpec moe;

  bool is_moe() const { return moe.experts > 0; }
  int head_dim() const { return hidden / heads; }
  int kv_dim() const { return head_dim() * kv_heads; }
  bool is_moe_layer(int layer) const { return is_moe() && layer % moe.every == moe.every - 1; }
  int moe_layers() const { return is_moe() ? layers / moe.every : 0; }
  int dense_layers() const { return layers - moe_layers(); }

  // Parameter counts (whole model, before any parallel split).
  double attention_params() const;     // per layer: QKV and output projection
  double mlp_params() const;           // one dense MLP (= one expert)
  double nonexpert_params() const;     // everything but experts: embeddings, attention, norms, dense MLPs, gates
  double expert_params() const;        // all experts of all MoE layers
  double total_params() const { return nonexpert_params() + expert_params(); }

  // Overrides from the command line, re-validated.
  void set_experts(int experts);
  void validate(const std::string& origin) const;  // throws InputError naming origin
};

// Loads a model file; unknown keys, wrong types and impossible values are InputErrors with
// file:line:column and the key.
ModelSpec load_model(const std::string& path);

}  // namespace tedsim
