#pragma once
// Enumerates every valid configuration for G devices, prunes those that do not fit, ranks the rest
// by throughput. Deterministic: ties keep enumeration order.
#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tedsim/search/evaluator.hpp"
#include "tedsim/search/plan_knobs.hpp"

namespace tedsim {

struct SearchSpace {
  int gpus = 1;
  int global_batch = 1;
  int seq_len = 0;
  std::vector<int> zero_stages = {0, 1, 2, 3};  // ZeRO stages to consider
  int max_pp = 0;     // pipeline degrees up to this (0: every divisor of the devices)
  int max_vpp = 8;    // model chunks per pipeline rank up to this (V > 1 where P x V divides the layers)
  int max_cp = 1;     // context degrees up to this (1: none; search --max-cp)
  bool sequence_parallel = true;  // consider SP where t > 1
  // Shared experts on a side stream during the all-to-alls: it only hides time, so every plan of a
  // model with shared experts uses it (Megatron-Core's --moe-shared-expert-overlap).
  bool shared_expert_overlap = true;
  MoeDispatcher moe_dispatcher = MoeDispatcher::alltoall;  // every plan's (--moe-dispatcher)
  Dtype adam_moments = Dtype::fp32;                        // every plan's (--adam-moments)
  std::uint8_t cuda_graph_scopes = 0;                      // every plan's (--cuda-graph-scope)
  bool fused_grouped_mlp = false;                          // every plan's (--fused-grouped-mlp)
  bool fp8_attention = false;                              // every plan's (--fp8-attention)
  // Expert all-to-all overlap: each plan without it, with it where Megatron-Core allows it, or
  // both (--moe-a2a-overlap off|on|both); its SMs (--moe-a2a-overlap-sms).
  std::vector<bool> a2a_overlap = {false};
  int a2a_overlap_sms = 20;
  std::vector<Recompute> recompute = {Recompute::none, Recompute::selective, Recompute::full};
};

// One feasible configuration as the search saw it (kept only when asked: HTML scatter plots).
struct PlanPoint {
  ParallelConfig config;
  double iteration_s = 0, tokens_per_s = 0, peak_bytes = 0;
};

struct SearchResult {
  long long evaluated = 0;
  long long feasible = 0;
  double seconds = 0;
  double smallest_peak = 0;     // bytes: the lowest memory peak of any configuration (0: none)
  double capacity = 0;          // bytes of usable device memory
  std::vector<Prediction> top;  // best first
  // For each choice the best plan turns on (plan_knobs.hpp), the best plan with it off, if any fits.
  std::array<std::optional<Prediction>, kKnobCount> without;
  // With `every_point`: each feasible configuration, in enumeration order.
  std::vector<PlanPoint> points;
};

// Whether two ranked plans predict the same (iteration and peak memory): their differing knobs
// have no effect on this problem, so the ranking shows the second as a note, not a row.
bool predicts_the_same(const Prediction& a, const Prediction& b);

// Why `space` holds no valid configuration for `model`: how many candidate (P, t, e) the first
// broken rule of each removed, and the global batches near the asked one that would work. Empty if
// some configuration is valid.
std::string explain_no_valid_configuration(const ModelSpec& model, const SearchSpace& space);

// Every valid configuration in enumeration order (what search ranks).
std::vector<ParallelConfig> enumerate_configs(const ModelSpec& model, const SearchSpace& space);

// `progress(done, total)` is called now and then for long searches. `threads` share the work; the
// result is the same for any count (ties keep enumeration order). `every_point` keeps a PlanPoint
// of every feasible configuration, which evaluates each one fully (no pruning by bounds): slower.
SearchResult run_search(const Evaluator& evaluator, const SearchSpace& space, int top_k,
                        const std::function<void(long long, long long)>& progress = {}, int threads = 1,
                        bool every_point = false);

}  // namespace tedsim
