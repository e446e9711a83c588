// The kernel-list test: every kernel a real training step runs (counted by the kernel census)
// must be one the cost model prices for that configuration, or be listed below with the reason it
// is not. A new kernel in the runtime fails this test until the workload knows it.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "runtime_test_world.hpp"
#include "tedsim/model/workload.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/runtime/kernel_census.hpp"
#include "tedsim/runtime/trainer.hpp"
#include "tedsim/search/evaluator.hpp"
#include "tedsim/spec/data_files.hpp"

namespace tedsim::test {
namespace {

// What the workload holds for one configuration: op names and kernel kinds over every block.
struct Priced {
  std::set<std::string> names;
  std::set<int> kinds;
  bool gemm = false, adam = false;
  bool has(const char* prefix) const {
    for (const std::string& n : names)
      if (n.rfind(prefix, 0) == 0) return true;
    return false;
  }
  bool kind(KernelKind k) const { return kinds.count(int(k)) > 0; }
};

Priced priced(const Workload& w) {
  Priced p;
  for (const Block* b : w.blocks())
    for (int i = 0; i < b->count; ++i) {
      const Op& op = b->ops[i];
      p.names.insert(op.name);
      if (op.flops > 0) p.gemm = true;
      if (!op.is_collective && op.flops <= 0) p.kinds.insert(int(op.kernel));
    }
  p.adam = w.optimizer_seconds(w.nonexpert_params_rank, w.expert_params_rank) > 0;
  return p;
}

using Check = std::function<bool(const Priced&)>;
Check of_kind(KernelKind k) {
  return [k](const Priced& p) { return p.kind(k); };
}
Check named(const char* prefix) {
  return [prefix](const Priced& p) { return p.has(prefix); };
}

// Each StepOps kernel and the workload op that prices it.
const std::map<std::string, Check>& priced_as() {
  static const std::map<std::string, Check> table = {
      {"gemm", [](const Priced& p) { return p.gemm; }},
      {"add_into", named("residual_")},
      {"layernorm_forward", of_kind(KernelKind::layernorm)},
      {"layernorm_backward", of_kind(KernelKind::layernorm)},
      {"rmsnorm_forward", of_kind(KernelKind::layernorm)},
      {"rmsnorm_backward", of_kind(KernelKind::layernorm)},
      {"rotary_forward", named("rotary")},
      {"rotary_backward", named("rotary")},
      {"gelu_forward", of_kind(KernelKind::activation)},
      {"gelu_backward", of_kind(KernelKind::activation)},
      {"swiglu_forward", of_kind(KernelKind::activation)},
      {"swiglu_backward", of_kind(KernelKind::activation)},
      {"attention_forward", [](const Priced& p) { return p.has("attn_scores") && p.has("attn_softmax"); }},
      {"attention_backward", [](const Priced& p) { return p.has("attn_scores") && p.has("attn_softmax"); }},
      {"adam_step", [](const Priced& p) { return p.adam; }},
      {"split_heads", named("attn_split_heads")},
      {"merge_heads_grad", named("attn_split_heads")},
      {"heads_to_tokens", named("attn_merge_heads")},
      {"tokens_to_heads", named("attn_merge_heads")},
      {"gating_forward", of_kind(KernelKind::gating)},
      {"route_forward", of_kind(KernelKind::gating)},
      {"gating_backward", of_kind(KernelKind::gating)},
      {"dispatch", of_kind(KernelKind::dispatch)},
      {"dispatch_backward", of_kind(KernelKind::dispatch)},
      {"combine", of_kind(KernelKind::combine)},
      {"combine_backward", of_kind(KernelKind::combine)},
      // The step's strided copies: expert-major regrouping around the experts, DTD's slices.
      // MLA's per-head layouts (its q, k, v are not one projection's split).
      {"copy_rows",
       [](const Priced& p) {
         return p.has("expert_major_layout") || p.has("dtd_slice") || p.has("attn_split_heads") || p.has("mtp_concat");
       }},
      {"embedding_forward", named("embedding_lookup")},
      {"embedding_backward", named("embedding_bwd")},
      {"ce_max_and_target", named("cross_entropy")},
      {"ce_exp_and_sum", named("cross_entropy")},
      {"ce_gradient", named("cross_entropy_bwd")},
  };
  return table;
}

// Kernels the workload knowingly does not price, and why.
const std::map<std::string, const char*>& not_priced() {
  static const std::map<std::string, const char*> table = {
      {"copy", "staging copies inside a collective's or a p2p send's timed region (message buffers, CAC's stash, "
               "dropless packing), and the experts' input kept for backward where no regrouping is needed: a GPU "
               "framework keeps references where this step copies"},
      {"to_host", "host readbacks of scalars and checksums (loss, non-finite checks): microseconds per step"},
      {"from_host", "host uploads of a few scalars for the loss's reductions"},
      {"aux_loss", "the load-balancing loss: one pass over [E] counts"},
      {"routing_choices", "host copies of the routing for the equivalence tests' signatures"},
      {"routing_counts", "host copies of the per-expert counts (dropless sizes, imbalance)"},
      {"aux_statistics", "sequence parallelism: the router's [2E] counts and probability sums, on the host"},
      {"set_group_aux", "sequence parallelism: the aux loss of the tensor group's summed [2E] statistics"},
  };
  return table;
}

void expect_every_kernel_priced(const ModelSpec& m, const ParallelConfig& c) {
  Communicator& world = runtime_world();
  runtime::KernelCensus census;
  runtime::TrainerOptions o;
  o.census = &census;
  runtime::Trainer trainer(world, m, c, o);
  trainer.step();
  const TopologySpec topo = load_topology(resolve_data_file("topologies", "local-cpu"));
  const AnalyticProfile profile(topo);
  const Evaluator evaluator(m, topo, profile);
  const Priced p = priced(build_workload(m, c, profile, evaluator.spans_for(c)));
  ASSERT_FALSE(census.kernels.empty());
  for (const auto& [name, count] : census.kernels) {
    if (not_priced().count(name)) continue;
    const auto it = priced_as().find(name);
    ASSERT_NE(it, priced_as().end()) << "the step runs kernel '" << name << "' (" << count.calls << " calls) on " << m.name
                                     << " " << c.describe() << ", which the workload does not know: price it in "
                                     << "model/layer_ops.cpp or list it in not_priced() with the reason";
    EXPECT_TRUE(it->second(p)) << "the step runs '" << name << "' on " << m.name << " " << c.describe()
                               << " but the workload of that configuration has no op pricing it";
  }
}

ParallelConfig config(int gpus, int tp, int ep, int pp, bool dtd) {
  ParallelConfig c;
  c.gpus = gpus;
  c.tp = tp;
  c.ep = ep;
  c.pp = pp;
  c.micro_batch = 2;
  c.global_batch = 4 * (gpus / (tp * pp));
  c.dtd = dtd;
  c.recompute = Recompute::full;
  return c;
}

TEST(KernelList, OneRankStepsRunOnlyPricedKernels) {
  if (runtime_world().size() != 1) GTEST_SKIP() << "runs on one rank";
  expect_every_kernel_priced(load_model(resolve_data_file("models", "tiny-moe")), config(1, 1, 1, 1, false));
  expect_every_kernel_priced(load_model(resolve_data_file("models", "cpu-moe-fine")), config(1, 1, 1, 1, false));
  // RMSNorm, grouped-query attention with RoPE, SwiGLU experts.
  expect_every_kernel_priced(load_model(resolve_data_file("models", "cpu-qwen-moe")), config(1, 1, 1, 1, false));
  // Multi-head latent attention, a multi-token-prediction module; and two of them.
  ModelSpec deepseek = load_model(resolve_data_file("models", "cpu-deepseek-moe"));
  expect_every_kernel_priced(deepseek, config(1, 1, 1, 1, false));
  deepseek.mtp_layers = 2;
  expect_every_kernel_priced(deepseek, config(1, 1, 1, 1, false));
}

TEST(KernelList, TwoRankStepsRunOnlyPricedKernels) {
  if (runtime_world().size() != 2) GTEST_SKIP() << "runs on two ranks";
  const ModelSpec tiny = load_model(resolve_data_file("models", "tiny-moe"));
  expect_every_kernel_priced(tiny, config(2, 1, 2, 1, false));  // all-to-all, expert-major regrouping
  expect_every_kernel_priced(tiny, config(2, 2, 1, 1, true));   // DTD's capacity slices
  expect_every_kernel_priced(tiny, config(2, 1, 1, 2, false));  // a pipeline: p2p sends
  ParallelConfig sp = config(2, 2, 1, 1, false);
  sp.sequence_parallel = true;
  expect_every_kernel_priced(tiny, sp);  // sequence parallelism: norms on token shards, the router's statistics
  expect_every_kernel_priced(load_model(resolve_data_file("models", "cpu-moe-fine")), config(2, 1, 2, 1, false));  // dropless
  expect_every_kernel_priced(load_model(resolve_data_file("models", "cpu-qwen-moe")), config(2, 2, 1, 1, false));  // RoPE on split heads
  // MLA and multi-token prediction's eh_proj over t; the module on the last stage with its embedding copy.
  const ModelSpec deepseek = load_model(resolve_data_file("models", "cpu-deepseek-moe"));
  expect_every_kernel_priced(deepseek, config(2, 2, 1, 1, false));
  expect_every_kernel_priced(deepseek, config(2, 1, 1, 2, false));
}

}  // namespace
}  // namespace tedsim::test
