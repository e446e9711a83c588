// Megatron-Core's expert all-to-all overlap (sim/overlapped_pair.hpp): the merged step's arithmetic
// by hand, the nodes a real MoE layer splits into, the schedule's extra warm-up forward, what the
// timeline saves against the same plan without it, Megatron-Core's rules, memory and search.
#include <gtest/gtest.h>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/memory.hpp"
#include "tedsim/search/search.hpp"
#include "tedsim/sim/overlapped_pair.hpp"
#include "tedsim/sim/simulator.hpp"
#include "tedsim/spec/pipeline_schedule.hpp"

namespace tedsim {
namespace {

// Compute beside communication, both starting together, the compute slowed while the
// communication holds its SMs.
TEST(A2aOverlap, AStepRunsComputeBesideCommunicationOnTheSMsLeft) {
  // 10 s of compute beside 4 s of all-to-all on a quarter of the SMs: 4 s at 3/4 speed do 3 s of
  // the work, the other 7 s run alone after: 11 s, 1 s of it the contention; the 4 s are hidden.
  MergedTime t = overlapped_step(10, 4, 0.25);
  EXPECT_DOUBLE_EQ(t.seconds, 11);
  EXPECT_DOUBLE_EQ(t.contention, 1);
  EXPECT_DOUBLE_EQ(t.hidden_other, 4);
  // 2 s of compute beside 8 s: at half speed it ends at 4 s, inside the communication.
  t = overlapped_step(2, 8, 0.5);
  EXPECT_DOUBLE_EQ(t.seconds, 8);
  EXPECT_DOUBLE_EQ(t.contention, 2);
  EXPECT_DOUBLE_EQ(t.hidden_other, 4);
  // Nothing beside: serial.
  EXPECT_DOUBLE_EQ(overlapped_step(3, 0, 0.5).seconds, 3);
  EXPECT_DOUBLE_EQ(overlapped_step(0, 3, 0.5).seconds, 3);
}

// Four steps: F.attn | B.combine, B.mlp | F.dispatch, F.mlp | B.dispatch, B.attn | F.combine.
TEST(A2aOverlap, ALayerPairRunsInFourSteps) {
  PassNodes f, b;
  f.attn = 3, f.dispatch = 2, f.mlp = 5, f.combine = 1, f.combine_a2a = 1;
  b.combine = 2, b.combine_a2a = 2, b.mlp = 8, b.dispatch = 3, b.attn = 4;
  const MergedTime t = merge_layers(f, b, 0.0);
  EXPECT_DOUBLE_EQ(t.seconds, 3 + 8 + 5 + 4);  // against 11 + 17 one after the other
  EXPECT_DOUBLE_EQ(t.hidden_a2a, 2 + 2 + 3 + 1);
  EXPECT_DOUBLE_EQ(t.contention, 0);
  // The combine node's tail (after its all-to-all) is communication-stream work but not all-to-all.
  f.combine = 1.5;
  const MergedTime tail = merge_layers(f, b, 0.0);
  EXPECT_DOUBLE_EQ(tail.hidden_a2a + tail.hidden_other, 2 + 2 + 3 + 1.5);
  EXPECT_NEAR(tail.hidden_a2a, 2 + 2 + 3 + 1, 1e-12);
  // The host's waits stay serial.
  f.host = 0.5;
  b.host = 0.25;
  EXPECT_DOUBLE_EQ(merge_layers(f, b, 0.0).seconds, tail.seconds + 0.75);
}

// A real MoE layer splits at its two all-to-alls; the nodes hold all of the pass's time.
TEST(A2aOverlap, AMoeLayerSplitsAtItsAllToAlls) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "dgx-h100");
  ParallelConfig c = test::config(16, 1, 16, 1, 64);
  c.recompute = Recompute::selective;
  c.recompute_modules = kRecomputeMoeAct | kRecomputeLayernorm;
  const Workload w = bench.workload(c);
  const PassNodes f = forward_nodes(w.moe.forward);
  EXPECT_NEAR(f.total(), w.moe.forward.seconds, 1e-12);
  EXPECT_NEAR(f.dispatch, test::op_seconds(w.moe.forward, "ep_alltoall_dispatch"), 1e-15);
  EXPECT_GT(f.combine_a2a, 0);
  EXPECT_GT(f.attn, 0);
  EXPECT_GE(f.mlp, test::op_seconds(w.moe.forward, "expert_fc1") + test::op_seconds(w.moe.forward, "expert_fc2"));
  const PassNodes b = backward_nodes(w.moe.recompute, w.moe.backward);
  EXPECT_NEAR(b.total(), w.moe.recompute.seconds + w.moe.backward.seconds, 1e-12);
  EXPECT_GT(b.dispatch, 0);
  EXPECT_GT(b.combine_a2a, 0);
  EXPECT_GT(b.mlp, f.mlp);  // the experts' data and weight gradients
  // The experts' activation is recomputed just before their backward: with the mlp node.
  const PassNodes without_recompute = backward_nodes(Block{}, w.moe.backward);
  EXPECT_NEAR(b.mlp - without_recompute.mlp, test::op_seconds(w.moe.recompute, "expert_activation"), 1e-15);
}

// One more warm-up forward; each steady-state forward then merges with the backward after it.
TEST(A2aOverlap, TheScheduleWarmsUpOneForwardMore) {
  EXPECT_EQ(warmup_forwards(0, 1, 1, 4, true), 1);
  EXPECT_EQ(warmup_forwards(0, 4, 2, 8, true), warmup_forwards(0, 4, 2, 8) + 1);
  EXPECT_EQ(warmup_forwards(0, 1, 1, 1, true), 1);  // capped at the micro-batches
  const StageOrder order(0, 1, 1, 3, true);
  const std::vector<PipelineTask> tasks = stage_order(0, 1, 1, 3, true);
  // F0 | F1 B0 | F2 B1 | B2
  ASSERT_EQ(tasks.size(), 6u);
  const int want_mb[] = {0, 1, 0, 2, 1, 2};
  const bool want_bwd[] = {false, false, true, false, true, true};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(tasks[std::size_t(i)].microbatch, want_mb[i]) << i;
    EXPECT_EQ(tasks[std::size_t(i)].backward, want_bwd[i]) << i;
    EXPECT_EQ(order.merges_with_next(i), i == 1 || i == 3) << i;
  }
  EXPECT_FALSE(StageOrder(0, 1, 1, 3).merges_with_next(1));
}

// One stage: the overlap saves, on each of the m - 1 merged steps, what merging each layer pair
// saves; everything else of the iteration is the same.
TEST(A2aOverlap, OneStageSavesWhatEachMergedStepSaves) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "dgx-h100");
  ParallelConfig c = test::config(16, 1, 16, 1, 128);
  c.recompute = Recompute::none;
  c.moe_dispatcher = MoeDispatcher::flex;
  const Workload w = bench.workload(c);
  const Prediction off = bench.evaluator.evaluate(c);
  c.moe_a2a_overlap = true;
  validate_config(c, bench.m);
  const Prediction on = bench.evaluator.evaluate(c);
  const double f = double(c.moe_a2a_overlap_sms) / bench.topo.device.sms;
  double saved = 0;
  for (int k = 0; k < bench.m.layers; ++k) {
    const LayerBlocks& fl = w.layer_blocks(bench.m, k);
    const LayerBlocks& bl = w.layer_blocks(bench.m, bench.m.layers - 1 - k);
    const PassNodes fn = forward_nodes(fl.forward), bn = backward_nodes(bl.recompute, bl.backward);
    saved += fn.total() + bn.total() - merge_layers(fn, bn, f).seconds;
  }
  const int merged_steps = w.shape.ga - 1;
  ASSERT_GT(saved, 0);
  EXPECT_NEAR(off.sim.iteration_s - on.sim.iteration_s, merged_steps * saved, 1e-9 * off.sim.iteration_s);
  // The all-to-alls still run (busy) but are mostly hidden (exposed); the SMs they hold slow compute.
  EXPECT_DOUBLE_EQ(on.sim.busy[int(Phase::ep_alltoall)], off.sim.busy[int(Phase::ep_alltoall)]);
  EXPECT_LT(on.sim.exposed[int(Phase::ep_alltoall)], 0.5 * off.sim.exposed[int(Phase::ep_alltoall)]);
  EXPECT_GT(on.sim.busy[int(Phase::compute)], off.sim.busy[int(Phase::compute)]);
  double exposed = 0;
  for (int p = 0; p < kPhaseCount; ++p) exposed += on.sim.exposed[p];
  EXPECT_NEAR(exposed, on.sim.iteration_s, 1e-9 * on.sim.iteration_s);
  // With more SMs for the all-to-alls, less is saved.
  c.moe_a2a_overlap_sms = 66;
  EXPECT_GT(bench.evaluator.evaluate(c).sim.iteration_s, on.sim.iteration_s);
  // The merged step runs the next forward beside the backward, layer by layer: one layer more in
  // flight (of Qwen3-30B's 48), not one more micro-batch.
  EXPECT_GT(on.memory.activations, off.memory.activations);
  EXPECT_LT(on.memory.activations, off.memory.activations * (1.0 + 1.5 / bench.m.layers));
}

// The merged schedule's peak against a replay at the granularity of layers: warm-up forwards
// whole, then each steady step's forward layer i beside its backward's layer L-1-i, then the
// cool-down backwards. The closed form may exceed the replay by at most one layer (it takes the
// stage's largest layer and the whole forward-minus-backward difference).
TEST(A2aOverlap, MergedStepsHoldOneLayerMoreNotOneChunk) {
  constexpr int kLayers = 4;  // per chunk
  for (int pp : {1, 2, 4})
    for (int vpp : {1, 2})
      for (int m : {4, 8}) {
        if (vpp > 1 && (pp == 1 || m % pp != 0)) continue;
        for (int stage = 0; stage < pp; ++stage) {
          const double uneven[] = {8.0, 12.0};
          const double even[] = {8.0, 8.0};
          for (const double* bytes : {even, uneven}) {
            const double largest_layer = (vpp > 1 ? 12.0 : 8.0) / kLayers;
            const StageOrder order(stage, pp, vpp, m, /*merged=*/true);
            const int warmup = warmup_forwards(stage, pp, vpp, m, true), total = m * vpp;
            double now = 0, peak = 0;
            for (int k = 0; k < warmup; ++k) {
              now += bytes[order[k].chunk];
              peak = std::max(peak, now);
            }
            for (int j = 0; j < total - warmup; ++j) {
              const PipelineTask f = order[warmup + 2 * j], b = order[warmup + 2 * j + 1];
              ASSERT_FALSE(f.backward);
              ASSERT_TRUE(b.backward);
              for (int i = 0; i < kLayers; ++i) {
                now += bytes[f.chunk] / kLayers;
                peak = std::max(peak, now);
                now -= bytes[b.chunk] / kLayers;
              }
            }
            const double closed = peak_in_flight_bytes(stage, pp, vpp, m, bytes, true, largest_layer);
            EXPECT_GE(closed, peak - 1e-12) << pp << " " << vpp << " " << m << " " << stage;
            EXPECT_LE(closed, peak + largest_layer + 1e-12) << pp << " " << vpp << " " << m << " " << stage;
            // Unmerged, the same warm-up holds a whole chunk more at its peak.
            if (bytes == even && warmup < total)
              EXPECT_DOUBLE_EQ(peak_in_flight_bytes(stage, pp, vpp, m, bytes, true, largest_layer),
                               warmup * 8.0 + largest_layer);
          }
        }
      }
}

// Interleaved pipelines merge too; the timeline's phases still sum to the iteration, and search's
// lower bound stays below what the timeline finds.
TEST(A2aOverlap, InterleavedPipelinesMergeAndTheLowerBoundHolds) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "dgx-h100");
  ParallelConfig c = test::config(64, 1, 16, 1, 256);
  c.pp = 4;
  c.vpp = 2;
  c.recompute = Recompute::none;
  const Prediction off = bench.evaluator.evaluate(c);
  c.moe_a2a_overlap = true;
  validate_config(c, bench.m);
  const Workload w = bench.workload(c);
  const Prediction on = bench.evaluator.evaluate(c);
  EXPECT_LT(on.sim.iteration_s, off.sim.iteration_s);
  double exposed = 0;
  for (int p = 0; p < kPhaseCount; ++p) exposed += on.sim.exposed[p];
  EXPECT_NEAR(exposed, on.sim.iteration_s, 1e-9 * on.sim.iteration_s);
  EXPECT_LE(iteration_lower_bound(bench.m, w, on.stage_map, true), on.sim.iteration_s);
  EXPECT_GT(iteration_lower_bound(bench.m, w, on.stage_map, false), iteration_lower_bound(bench.m, w, on.stage_map, true));
}

// Megatron-Core's own refusals (transformer_config.py at 2edffadb), each named.
TEST(A2aOverlap, MegatronCoresRulesAreEnforced) {
  const ModelSpec m = test::model("qwen3-30b-a3b");
  ParallelConfig c = test::config(32, 1, 16, 1, 64);
  c.recompute = Recompute::none;
  c.moe_a2a_overlap = true;
  EXPECT_EQ(config_violation(c, m), "");
  auto broken = [&](auto change) {
    ParallelConfig x = c;
    change(x);
    return config_violation(x, m);
  };
  EXPECT_NE(broken([](ParallelConfig& x) { x.ep = 1; }).find("ep > 1"), std::string::npos);
  EXPECT_NE(broken([](ParallelConfig& x) { x.pp = 2; }).find("vpp > 1"), std::string::npos);
  EXPECT_NE(broken([](ParallelConfig& x) { x.recompute = Recompute::full; }).find("full recompute"), std::string::npos);
  EXPECT_NE(broken([](ParallelConfig& x) {
              x.recompute = Recompute::selective;
              x.recompute_modules = kRecomputeMoe;
            }).find("moe module"),
            std::string::npos);
  EXPECT_NE(broken([](ParallelConfig& x) { x.cuda_graph_scopes = kGraphMlp; }).find("mlp scope"), std::string::npos);
  EXPECT_NE(broken([](ParallelConfig& x) { x.shared_expert_overlap = true; }).find("--shared-expert-overlap"), std::string::npos);
  EXPECT_NE(broken([](ParallelConfig& x) { x.moe_a2a_overlap_sms = 0; }).find("positive"), std::string::npos);
  EXPECT_THROW(validate_config([&] {
                 ParallelConfig x = c;
                 x.ep = 1;
                 return x;
               }(),
                               m),
               InputError);
}

// Search with both: each plan with experts over ranks also appears with the overlap, where allowed.
TEST(A2aOverlap, SearchTriesBothWhereAllowed) {
  const ModelSpec m = test::model("qwen3-30b-a3b");
  SearchSpace space;
  space.gpus = 16;
  space.global_batch = 64;
  space.seq_len = 1024;
  space.a2a_overlap = {false, true};
  int with = 0, without = 0;
  for (const ParallelConfig& c : enumerate_configs(m, space)) {
    (c.moe_a2a_overlap ? with : without) += 1;
    if (c.moe_a2a_overlap) {
      EXPECT_GT(c.ep, 1);
      EXPECT_FALSE(c.full_recompute());
      EXPECT_FALSE(c.shared_expert_overlap);
    }
  }
  EXPECT_GT(with, 0);
  EXPECT_GT(without, with);
}

}  // namespace
}  // namespace tedsim
