#pragma once
// One point of the search space: how a model is split over G devices and how the step is run.
#include <string>

#include "tedsim/spec/rank_layout.hpp"

namespace tedsim {

struct ModelSpec;

struct ParallelConfig {
  int gpus = 1;
  int tp = 1;               // tensor degree t
  int ep = 1;               // expert degree e
  int micro_batch = 1;      // sequences per data-parallel replica per micro-batch (b)
  int global_batch = 1;     // sequences per iteration (B)
  int seq_len = 0;          // 0: the model's
  bool dtd = false;         // duplicate token dropping around the expert all-to-alls
  bool cac = false;         // communication-aware activation checkpointing
  bool checkpoint = true;   // full activation checkpointing (recompute every layer in backward)
  int zero = 1;             // ZeRO stage 0, 1 or 2
  bool expert_tp = true;    // experts split over the tensor group (else whole, C/t tokens per rank)
  bool tiled_optimizer = true;  // expert optimizer step in tiles (no fp32 upcast spike)
  RankLayout layout = RankLayout::ted;

  int dp() const { return gpus / tp; }
  int dp_expert() const { return expert_tp ? gpus / (tp * ep) : gpus / ep; }
  int grad_accum() const { return global_batch / (micro_batch * dp()); }
  std::string describe() const;  // "t=2 e=4 d=16 b=1 ga=4 dtd cac ckpt zero=1 etp ted"
};

// Throws InputError explaining the first rule `c` breaks for `m` (tp dividing heads, ep dividing
// experts, t*e dividing G, global batch divisible by b*d, CAC only with checkpointing, ...).
void validate_config(const ParallelConfig& c, const ModelSpec& m);
// Same rules, as a cheap predicate for search enumeration.
bool config_is_valid(const ParallelConfig& c, const ModelSpec& m);
// The first rule `c` breaks for `m`, in words ("ep 16 does not divide experts 4"); empty if none.
std::string config_violation(const ParallelConfig& c, const ModelSpec& m);

RankLayout parse_layout(const std::string& text);  // "ted" or "data_before_expert"

}  // namespace tedsim
