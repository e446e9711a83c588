// Multi-token prediction (DeepSeek-V3 section 2.2; Megatron-Core's --mtp-num-layers): where the
// modules sit in the pipeline, what they add to the FLOPs, the last stage's time and its memory,
// all hand-computed from the blocks they are made of.
#include <gtest/gtest.h>

#include <cstring>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/memory.hpp"
#include "tedsim/sim/simulator.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim {
namespace {

double pass(const LayerBlocks& l) { return l.forward.seconds + l.recompute.seconds + l.backward.seconds; }

TEST(Mtp, ModulesSitWithTheLoss) {
  const StageMap even = build_stage_map(8, 2, 2, {}, 1);
  EXPECT_EQ(even.chunks.back().mtp_layers, 1);
  EXPECT_TRUE(even.chunks.back().head);
  for (std::size_t i = 0; i + 1 < even.chunks.size(); ++i) EXPECT_EQ(even.chunks[i].mtp_layers, 0);
  const StageMap laid = build_stage_map(4, 2, 1, "Ett|ttmmL", 2);
  EXPECT_EQ(laid.chunks[1].mtp_layers, 2);
  EXPECT_EQ(laid.chunks[1].layers, 2);
  EXPECT_NE(laid.describe().find("+2m+L"), std::string::npos);
  // 'm' only right before L, as many as the model has, and none for a model without.
  EXPECT_THROW(build_stage_map(4, 2, 1, "Ett|tmtL", 1), InputError);
  EXPECT_THROW(build_stage_map(4, 2, 1, "Ettm|ttL", 1), InputError);
  EXPECT_THROW(build_stage_map(4, 2, 1, "Ett|ttL", 1), InputError);
  EXPECT_THROW(build_stage_map(4, 2, 1, "Ett|ttmmL", 1), InputError);
  EXPECT_THROW(build_stage_map(4, 2, 1, "Ett|ttmL", 0), InputError);
}

// On one rank with no gradient sync to hide, one module adds exactly its entry, a layer of the
// last layer's kind and the head, forward and backward, per micro-batch; its FLOPs likewise.
TEST(Mtp, OneModuleAddsItsBlocksToTheLastStage) {
  test::Bench bench(test::model("tiny-moe"), "dgx-h100");
  ParallelConfig c = test::config(1, 1, 1, 1, 4);
  c.recompute = Recompute::none;
  c.zero = 0;
  const Workload plain = bench.workload(c);
  const SimResult without = simulate_iteration(bench.m, c, plain);

  test::Bench mtp_bench(test::model("tiny-moe"), "dgx-h100");
  mtp_bench.m.mtp_layers = 1;
  const Workload w = mtp_bench.workload(c);
  const SimResult with = simulate_iteration(mtp_bench.m, c, w);
  const LayerBlocks& last = w.layer_blocks(mtp_bench.m, mtp_bench.m.layers - 1);
  const double module =
      w.mtp_forward.seconds + w.mtp_backward.seconds + pass(last) + w.head_forward.seconds + w.head_backward.seconds;
  const double compute_added = (with.busy[int(Phase::compute)] + with.busy[int(Phase::other)] + with.busy[int(Phase::host_launch)]) -
                               (without.busy[int(Phase::compute)] + without.busy[int(Phase::other)] + without.busy[int(Phase::host_launch)]);
  EXPECT_NEAR(compute_added, 4 * module, 1e-9);

  const double entry_flops = 2.0 * double(w.shape.tokens) * bench.m.hidden * 2.0 * bench.m.hidden;  // eh_proj [T,2h]x[2h,h]
  double eh_proj = 0;
  for (int i = 0; i < w.mtp_forward.count; ++i)
    if (std::strcmp(w.mtp_forward.ops[i].name, "mtp_eh_proj") == 0) eh_proj = w.mtp_forward.ops[i].flops;
  EXPECT_DOUBLE_EQ(eh_proj, entry_flops);
  const double module_flops = last.forward.flops + last.backward.flops + w.mtp_forward.flops + w.mtp_backward.flops +
                              w.head_forward.flops + w.head_backward.flops;
  EXPECT_NEAR(w.flops_per_microbatch - plain.flops_per_microbatch, module_flops, 1e-6 * module_flops);
  EXPECT_NEAR(w.model_flops_per_microbatch - plain.model_flops_per_microbatch, module_flops, 1e-6 * module_flops);
}

// A traced micro-batch draws every op its passes are timed with, the modules' among them.
TEST(Mtp, TheTraceDrawsTheModules) {
  test::Bench bench(test::model("tiny-moe"), "dgx-h100");
  bench.m.mtp_layers = 2;
  ParallelConfig c = test::config(1, 1, 1, 1, 2);
  c.recompute = Recompute::none;
  const Workload w = bench.workload(c);
  TraceRecorder trace;
  simulate_iteration(bench.m, c, w, &trace);
  int eh_proj = 0, lm_head = 0;
  double drawn = 0;
  for (const TraceEvent& e : trace.events()) {
    if (e.stream != Stream::compute) continue;
    if (std::strcmp(e.name.c_str(), "mtp_eh_proj") == 0) ++eh_proj;
    if (std::strcmp(e.name.c_str(), "lm_head") == 0) ++lm_head;
    if (e.phase != Phase::optimizer && e.phase != Phase::pp_bubble && e.phase != Phase::pp_p2p) drawn += e.duration_s;
  }
  const int microbatches = w.shape.ga;
  EXPECT_EQ(eh_proj, 2 * 3 * microbatches);  // forward, and backward (data and weight gradients)
  EXPECT_EQ(lm_head, 3 * microbatches);      // the main head and each module's
  const LayerBlocks& last = w.layer_blocks(bench.m, bench.m.layers - 1);
  double layers = 0;
  for (int l = 0; l < bench.m.layers; ++l) layers += pass(w.layer_blocks(bench.m, l));
  const double per_microbatch = w.embedding_forward.seconds + w.embedding_backward.seconds + layers +
                                3 * (w.head_forward.seconds + w.head_backward.seconds) +
                                2 * (w.mtp_forward.seconds + w.mtp_backward.seconds + pass(last));
  EXPECT_GE(drawn, microbatches * per_microbatch * (1 - 1e-9));
}

// The last stage holds the modules' weights (eh_proj, three norms and a layer each) and, per
// micro-batch in flight, their layer's activations.
TEST(Mtp, TheLastStageHoldsTheModulesWeights) {
  test::Bench bench(test::model("tiny-moe"), "dgx-h100");
  ParallelConfig c = test::config(2, 1, 1, 1, 8);
  c.pp = 2;
  c.recompute = Recompute::none;
  c.zero = 0;
  std::vector<MemoryBreakdown> plain, with;
  estimate_memory(bench.m, c, bench.workload(c), bench.topo, build_stage_map(bench.m.layers, 2, 1), &plain);
  ModelSpec m = bench.m;
  m.mtp_layers = 1;
  const Workload w = build_workload(m, c, bench.profile, bench.evaluator.spans_for(c));
  estimate_memory(m, c, w, bench.topo, build_stage_map(m.layers, 2, 1, {}, 1), &with);
  EXPECT_DOUBLE_EQ(with[0].weights, plain[0].weights);
  const double B = bytes_of(storage_dtype(m.dtype));  // tiny-moe trains in fp32
  EXPECT_NEAR(with[1].weights - plain[1].weights, (m.mtp_nonexpert_params() + m.mtp_expert_params()) * B, 1.0);
  EXPECT_GT(with[1].activations, plain[1].activations);
}

// Untied, a pipeline's last stage keeps its own copy of the embedding for the modules' lookups,
// whose gradient it sums with the first stage's (as tied embeddings do).
TEST(Mtp, AnUntiedPipelineKeepsAnEmbeddingCopyOnItsLastStage) {
  test::Bench bench(test::model("cpu-deepseek-moe"), "local-cpu");
  ASSERT_FALSE(bench.m.tie_embeddings);
  ASSERT_GT(bench.m.mtp_layers, 0);
  ParallelConfig c = test::config(2, 1, 1, 1, 8);
  c.pp = 2;
  const Workload with = bench.workload(c);
  ModelSpec plain_model = bench.m;
  plain_model.mtp_layers = 0;
  const Workload plain = build_workload(plain_model, c, bench.profile, bench.evaluator.spans_for(c));
  EXPECT_GT(with.tied_embedding_sync_seconds, 0);
  EXPECT_EQ(plain.tied_embedding_sync_seconds, 0);
  EXPECT_DOUBLE_EQ(with.head_grad_elems - plain.head_grad_elems, double(bench.m.vocab) * bench.m.hidden);
  // One stage: the modules look up the embedding itself.
  const ParallelConfig one = test::config(1, 1, 1, 1, 8);
  ModelSpec one_plain = bench.m;
  one_plain.mtp_layers = 0;
  EXPECT_DOUBLE_EQ(bench.workload(one).head_grad_elems,
                   build_workload(one_plain, one, bench.profile, bench.evaluator.spans_for(one)).head_grad_elems);
}

}  // namespace
}  // namespace tedsim
