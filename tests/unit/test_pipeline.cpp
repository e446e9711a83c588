// Pipeline stages: the schedules' orders, the stage map and layout strings, the timeline against
// the hand-computed 1F1B and interleaved iteration times (Narayanan et al. 2021), activation memory
// against Korthikanti et al. 2022, selective recompute's FLOPs, p2p bytes, and the timeline's
// steady-state extrapolation against a full simulation.
#include <gtest/gtest.h>

#include <numeric>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/memory.hpp"
#include "tedsim/spec/pipeline_schedule.hpp"
#include "tedsim/sim/simulator.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim {
namespace {

double sum(const PhaseTimes& t) { return std::accumulate(t.begin(), t.end(), 0.0); }

// A profile in which only compute costs time: every GEMM and kernel a fixed time, every collective
// and transfer nothing.
class ComputeOnlyProfile final : public Profile {
 public:
  double gemm_seconds(const GemmShape&) const override { return 1e-3; }
  double kernel_seconds(KernelKind, double, Dtype) const override { return 1e-4; }
  double collective_seconds(CollectiveOp, const GroupSpan&, double) const override { return 0.0; }
  double p2p_seconds(const GroupSpan&, double) const override { return 0.0; }
  std::string describe() const override { return "compute only"; }
};

// A dense model whose embedding and head cost nothing, so that stages are uniform: a workload of
// one op per layer pass, with the times given.
Workload uniform_workload(const Profile& profile, int microbatches, double layer_forward, double layer_backward) {
  Workload w;
  w.profile = &profile;
  w.shape.ga = microbatches;
  Op f;
  f.name = "layer_forward";
  f.seconds = layer_forward;
  w.dense.forward.add(f);
  Op b;
  b.name = "layer_backward";
  b.seconds = layer_backward;
  w.dense.backward.add(b);
  return w;
}

ModelSpec dense_model(int layers) {
  ModelSpec m = test::model("ted-1.3b");
  m.layers = layers;
  m.set_experts(0);
  return m;
}

ParallelConfig pipeline_config(int pp, int vpp, int microbatches) {
  ParallelConfig c;
  c.gpus = pp;
  c.pp = pp;
  c.vpp = vpp;
  c.global_batch = microbatches;
  c.recompute = Recompute::none;
  return c;
}

TEST(PipelineSchedule, OneFOneBWarmsUpPMinusStageForwards) {
  for (int stage = 0; stage < 4; ++stage) {
    const std::vector<PipelineTask> order = stage_order(stage, 4, 1, 8);
    ASSERT_EQ(order.size(), 16u);
    const int warmup = 4 - stage - 1;
    for (int i = 0; i < warmup; ++i) EXPECT_FALSE(order[std::size_t(i)].backward);
    // Then forward and backward alternate, micro-batches in order, until the cool-down.
    EXPECT_FALSE(order[std::size_t(warmup)].backward);
    EXPECT_TRUE(order[std::size_t(warmup + 1)].backward);
    EXPECT_EQ(order[std::size_t(warmup + 1)].microbatch, 0);
    EXPECT_TRUE(order.back().backward);
    EXPECT_EQ(order.back().microbatch, 7);
  }
}

TEST(PipelineSchedule, InterleavedOrderFollowsMegatron) {
  // P = 2, V = 2, m = 4 on stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards; micro-batches go
  // through the chunks in groups of P: F(0,c0) F(1,c0) F(0,c1) F(1,c1) F(2,c0) B(0,c1) F(3,c0) B(1,c1) ...
  const std::vector<PipelineTask> order = stage_order(0, 2, 2, 4);
  ASSERT_EQ(order.size(), 16u);
  const int expected[][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {2, 0, 0}, {0, 1, 1}, {3, 0, 0}, {1, 1, 1},
                             {2, 1, 0}, {0, 0, 1}, {3, 1, 0}, {1, 0, 1}, {2, 1, 1}, {3, 1, 1}, {2, 0, 1}, {3, 0, 1}};
  for (std::size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i].microbatch, expected[i][0]) << i;
    EXPECT_EQ(order[i].chunk, expected[i][1]) << i;
    EXPECT_EQ(order[i].backward, bool(expected[i][2])) << i;
  }
  EXPECT_EQ(warmup_forwards(1, 2, 2, 4), 2);
  EXPECT_EQ(warmup_forwards(0, 4, 2, 4), 8);  // (4-0-1)*2 + 4 = 10, capped at m * V = 8
  EXPECT_EQ(warmup_forwards(3, 4, 2, 4), 4);  // m == P: no special case in current Megatron-Core
}

TEST(PipelineLayout, ParsesMegatronLayoutStrings) {
  const std::vector<std::string> stages = expand_pipeline_layout("Et|(tt|)*30tL");
  ASSERT_EQ(stages.size(), 32u);
  EXPECT_EQ(stages.front(), "Et");
  EXPECT_EQ(stages[1], "tt");
  EXPECT_EQ(stages.back(), "tL");
  EXPECT_EQ(expand_pipeline_layout("Et*3|(tt|)*2,t|tL").size(), 5u);
  const StageMap map = build_stage_map(62, 16, 2, "Et|(tt|)*30tL");
  EXPECT_EQ(map.chunk(0, 0).layers, 1);
  EXPECT_TRUE(map.chunk(0, 0).embedding);
  EXPECT_EQ(map.chunk(0, 1).first_layer, 31);  // virtual stage 16 follows the first 16
  EXPECT_TRUE(map.chunk(15, 1).head);
  EXPECT_EQ(map.stage_layers(0), 3);
}

TEST(PipelineLayout, RejectsMalformedLayouts) {
  EXPECT_NE(pipeline_layout_violation("Et|tL", 3, 2, 1), "");      // 2 layers, model has 3
  EXPECT_NE(pipeline_layout_violation("Ett|tL", 3, 4, 1), "");     // 2 stages, want 4
  EXPECT_NE(pipeline_layout_violation("tEt|tL", 3, 2, 1), "");     // E not first
  EXPECT_NE(pipeline_layout_violation("Et|tLt", 3, 2, 1), "");     // L not last
  EXPECT_NE(pipeline_layout_violation("Et|(tt|tL", 4, 2, 1), "");  // unbalanced
  EXPECT_NE(pipeline_layout_violation("Et|tx|L", 2, 3, 1), "");    // unknown symbol
  EXPECT_EQ(pipeline_layout_violation("Ett|tL", 3, 2, 1), "");
  EXPECT_THROW(build_stage_map(3, 4, 1, "Ett|tL"), InputError);
}

TEST(PipelineLayout, UnevenSplitGivesTheMiddleStagesTheRemainder) {
  const StageMap map = build_stage_map(10, 4, 1);
  EXPECT_TRUE(map.uneven);
  EXPECT_EQ(map.stage_layers(0), 2);
  EXPECT_EQ(map.stage_layers(1), 3);
  EXPECT_EQ(map.stage_layers(2), 3);
  EXPECT_EQ(map.stage_layers(3), 2);
  int total = 0;
  for (int p = 0; p < 4; ++p) total += map.stage_layers(p);
  EXPECT_EQ(total, 10);
}

// Narayanan et al. 2021: with uniform stages and free communication, 1F1B takes (m + P - 1)(t_f + t_b)
// and interleaving V chunks (m + (P - 1)/V)(t_f + t_b), t_f and t_b over a whole stage.
TEST(PipelineTimeline, OneFOneBMatchesTheHandComputedIteration) {
  const ComputeOnlyProfile profile;
  for (const auto& [P, m] : {std::pair{2, 8}, std::pair{4, 8}, std::pair{4, 16}, std::pair{8, 64}, std::pair{4, 2}}) {
    const int layers = 4 * P;
    const ModelSpec model = dense_model(layers);
    const Workload w = uniform_workload(profile, m, 1e-3, 2e-3);
    const ParallelConfig c = pipeline_config(P, 1, m);
    const SimResult r = simulate_iteration(model, c, w, build_stage_map(layers, P, 1));
    const double tf = 4 * 1e-3, tb = 4 * 2e-3;
    const double expected = (m + P - 1) * (tf + tb);
    EXPECT_NEAR(r.iteration_s, expected, 0.01 * expected) << "P " << P << " m " << m;
    // The bubble share emerges from the dependencies.
    const double bubble = r.stages[0].bubble_s / r.iteration_s;
    EXPECT_NEAR(bubble, double(P - 1) / (m + P - 1), 0.01) << "P " << P << " m " << m;
    EXPECT_NEAR(sum(r.exposed), r.iteration_s, 1e-9 * r.iteration_s);
  }
}

TEST(PipelineTimeline, InterleavedMatchesTheHandComputedIteration) {
  const ComputeOnlyProfile profile;
  for (const auto& [P, V, m] : {std::tuple{2, 2, 8}, std::tuple{4, 2, 16}, std::tuple{4, 4, 16}, std::tuple{8, 2, 64}}) {
    const int layers = 2 * P * V;
    const ModelSpec model = dense_model(layers);
    const Workload w = uniform_workload(profile, m, 1e-3, 2e-3);
    const ParallelConfig c = pipeline_config(P, V, m);
    const SimResult r = simulate_iteration(model, c, w, build_stage_map(layers, P, V));
    const double tf = 2 * V * 1e-3, tb = 2 * V * 2e-3;  // a whole stage: V chunks of 2 layers
    const double expected = (m + double(P - 1) / V) * (tf + tb);
    EXPECT_NEAR(r.iteration_s, expected, 0.01 * expected) << "P " << P << " V " << V << " m " << m;
  }
}

TEST(PipelineTimeline, ExtrapolationEqualsAFullSimulation) {
  // A traced run simulates every micro-batch; an untraced one extrapolates from a few.
  test::Bench bench(test::model("mixtral-8x7b"), "dgx-h100");
  struct Case {
    int gpus, pp, vpp, tp, ep, b, batch, zero;
    bool sp;
    Recompute recompute;
  };
  const Case cases[] = {{64, 4, 1, 2, 8, 1, 256, 1, false, Recompute::full},
                        {64, 4, 2, 2, 8, 1, 256, 2, true, Recompute::selective},
                        {32, 8, 1, 1, 4, 2, 512, 3, false, Recompute::none},
                        {16, 2, 4, 1, 8, 1, 128, 0, false, Recompute::full},
                        {8, 1, 1, 1, 8, 1, 64, 2, false, Recompute::full},
                        {16, 1, 1, 2, 8, 1, 128, 1, false, Recompute::selective}};
  for (const Case& k : cases) {
    ParallelConfig c = test::config(k.gpus, k.tp, k.ep, k.b, k.batch);
    c.pp = k.pp;
    c.vpp = k.vpp;
    c.zero = k.zero;
    c.sequence_parallel = k.sp;
    c.dtd = false;
    c.cac = false;
    c.recompute = k.recompute;
    validate_config(c, bench.m);
    const Workload w = bench.workload(c);
    TraceRecorder trace;
    const SimResult fast = simulate_iteration(bench.m, c, w);
    const SimResult full = simulate_iteration(bench.m, c, w, &trace);
    EXPECT_NEAR(fast.iteration_s, full.iteration_s, 1e-9 * full.iteration_s) << c.describe();
    for (int p = 0; p < kPhaseCount; ++p)
      EXPECT_NEAR(fast.exposed[p], full.exposed[p], 1e-9 * full.iteration_s) << c.describe() << " " << to_string(Phase(p));
    EXPECT_EQ(fast.grad_buckets, full.grad_buckets) << c.describe();
  }
}

TEST(PipelineTimeline, PointToPointCarriesTheActivationEachWay) {
  test::Bench bench(test::model("ted-1.3b"), "dgx-h100");
  for (bool sp : {false, true}) {
    ParallelConfig c = test::config(16, 2, 1, 2, 64);
    c.pp = 2;
    c.sequence_parallel = sp;
    c.dtd = false;
    validate_config(c, bench.m);
    const Workload w = bench.workload(c);
    const double bsh = 2.0 * bench.m.seq_len * bench.m.hidden * bytes_of(bench.m.dtype);
    EXPECT_DOUBLE_EQ(w.p2p_bytes, sp ? bsh / 2 : bsh);
    EXPECT_GT(w.p2p_seconds, 0);
    TraceRecorder trace;
    simulate_iteration(bench.m, c, w, &trace);
    int activations = 0, gradients = 0;
    for (const TraceEvent& e : trace.events()) {
      if (e.name == "p2p_send_activation" && e.stage == 0) ++activations;
      if (e.name == "p2p_send_gradient" && e.stage == 1) ++gradients;
      if (e.stream == Stream::p2p) EXPECT_DOUBLE_EQ(e.duration_s, w.p2p_seconds);
    }
    EXPECT_EQ(activations, c.grad_accum());
    EXPECT_EQ(gradients, c.grad_accum());
  }
}

// Korthikanti et al. 2022, section 4, per layer and micro-batch, 2-byte activations:
// no parallelism sbh(34 + 5as/h); TP without SP sbh(10 + 24/t + 5as/(ht)); TP + SP sbh/t (34 + 5as/h);
// TP + SP + selective recompute 34sbh/t; full recompute keeps the layer input, 2sbh (/t with SP).
TEST(PipelineMemory, LayerActivationsMatchKorthikanti) {
  ModelSpec m = dense_model(8);
  m.dtype = Dtype::bf16;
  const double s = m.seq_len, b = 2, h = m.hidden, a = m.heads;
  const double sbh = s * b * h;
  for (int t : {1, 2, 4, 8}) {
    for (bool sp : {false, true}) {
      if (sp && t == 1) continue;
      for (Recompute r : {Recompute::none, Recompute::selective}) {
        ParallelConfig c = test::config(t, t, 1, 2, 2);
        c.sequence_parallel = sp;
        c.recompute = r;
        const StepShape shape = resolve_shape(m, c);
        const double got = layer_activation_bytes(m, c, shape).dense;
        const double attn = r == Recompute::selective ? 0.0 : 5.0 * a * s / h;
        const double want = sp ? sbh / t * (34.0 + attn) : sbh * (10.0 + 24.0 / t + attn / t);
        EXPECT_NEAR(got, want, 0.01 * want) << "t " << t << " sp " << sp << " " << to_string(r);
      }
      // Full recompute: the stage keeps every layer's input.
      ParallelConfig c = test::config(t, t, 1, 2, 2);
      c.sequence_parallel = sp;
      c.recompute = Recompute::full;
      test::Bench bench(m, "dgx-h100");
      const Workload w = bench.workload(c);
      const LayerActivationBytes l = layer_activation_bytes(m, c, w.shape);
      const MemoryBreakdown mem = estimate_memory(m, c, w, bench.topo);
      const double logits = s * b * (double(m.vocab) / t) * 4.0;
      const double inputs = mem.activations - l.dense_full - logits;
      const double want = m.layers * 2.0 * sbh / (sp ? t : 1);
      EXPECT_NEAR(inputs, want, 0.01 * want) << "t " << t << " sp " << sp;
    }
  }
}

TEST(PipelineMemory, OneFOneBStageZeroKeepsPMicrobatches) {
  test::Bench bench(dense_model(16), "dgx-h100");
  const int P = 4;
  ParallelConfig c = test::config(P, 1, 1, 1, 16);
  c.pp = P;
  c.recompute = Recompute::none;
  const Workload w = bench.workload(c);
  const StageMap map = build_stage_map(bench.m.layers, P, 1);
  std::vector<MemoryBreakdown> stages;
  estimate_memory(bench.m, c, w, bench.topo, map, &stages);
  const double per_microbatch = 4 * layer_activation_bytes(bench.m, c, w.shape).dense;  // 4 layers a stage
  for (int p = 0; p < P - 1; ++p)
    EXPECT_NEAR(stages[std::size_t(p)].activations, (P - p) * per_microbatch, 1e-6 * per_microbatch) << "stage " << p;
  // Interleaved: stage 0 keeps P(1 + (P - 1)/(P V)) micro-batches' worth of its layers (Korthikanti).
  ParallelConfig v = c;
  v.vpp = 2;
  const Workload wv = bench.workload(v);
  estimate_memory(bench.m, v, wv, bench.topo, build_stage_map(bench.m.layers, P, 2), &stages);
  const double factor = P * (1.0 + double(P - 1) / (P * 2));
  EXPECT_NEAR(stages[0].activations, factor * per_microbatch, 1e-6 * per_microbatch);
}

TEST(PipelineFlops, SelectiveRecomputeAddsTheRecomputedModulesForward) {
  test::Bench bench(test::model("ted-1.3b"), "dgx-h100");
  ParallelConfig c = test::config(8, 2, 1, 1, 16);
  c.dtd = false;
  c.recompute = Recompute::none;
  const Workload none = bench.workload(c);
  c.recompute = Recompute::selective;
  c.recompute_modules = kRecomputeCoreAttn;
  const Workload core = bench.workload(c);
  double attn_core = 0;
  for (int i = 0; i < none.dense.forward.count; ++i) {
    const std::string name = none.dense.forward.ops[i].name;
    if (name == "attn_core" || name == "attn_scores" || name == "attn_context") attn_core += none.dense.forward.ops[i].flops;
  }
  ASSERT_GT(attn_core, 0);
  EXPECT_DOUBLE_EQ(core.flops_per_microbatch - none.flops_per_microbatch, bench.m.layers * attn_core);
  EXPECT_DOUBLE_EQ(core.model_flops_per_microbatch, none.model_flops_per_microbatch);
  // Recomputing the dense MLP adds its GEMMs' forward FLOPs on the dense layers.
  c.recompute_modules = kRecomputeMlp;
  const Workload mlp = bench.workload(c);
  double mlp_flops = 0;
  for (int i = 0; i < none.dense.forward.count; ++i) {
    const std::string name = none.dense.forward.ops[i].name;
    if (name == "mlp_fc1" || name == "mlp_fc2") mlp_flops += none.dense.forward.ops[i].flops;
  }
  EXPECT_DOUBLE_EQ(mlp.flops_per_microbatch - none.flops_per_microbatch, bench.m.dense_layers() * mlp_flops);
}

// MLA's up projections (DeepSeek-V3, Megatron-Core's mla_up_proj): recomputing them adds the q and
// kv up-projection GEMMs' forward FLOPs on every layer, dense and MoE alike.
TEST(PipelineFlops, MlaUpProjRecomputeAddsTheUpProjectionsForward) {
  test::Bench bench(test::model("deepseek-v3"), "dgx-h100");
  ParallelConfig c = test::config(64, 1, 64, 1, 64);
  c.recompute = Recompute::selective;
  c.recompute_modules = kRecomputeMlp;
  const Workload base = bench.workload(c);
  c.recompute_modules = kRecomputeMlp | kRecomputeMlaUpProj;
  const Workload up = bench.workload(c);
  double up_flops = 0;
  for (int i = 0; i < base.moe.forward.count; ++i) {
    const std::string name = base.moe.forward.ops[i].name;
    if (name == "mla_q_up" || name == "mla_kv_up") up_flops += base.moe.forward.ops[i].flops;
  }
  ASSERT_GT(up_flops, 0);
  // Every layer recomputes them, the multi-token-prediction module's too.
  EXPECT_NEAR(up.flops_per_microbatch - base.flops_per_microbatch, (bench.m.layers + bench.m.mtp_layers) * up_flops,
              1e-9 * up.flops_per_microbatch);
  EXPECT_DOUBLE_EQ(up.model_flops_per_microbatch, base.model_flops_per_microbatch);
}

TEST(PipelineTimeline, SequenceParallelismReplacesEachAllReduceWithTwoHalves) {
  test::Bench bench(test::model("ted-1.3b"), "dgx-h100");
  ParallelConfig c = test::config(8, 4, 1, 1, 16);
  c.dtd = false;
  const Workload plain = bench.workload(c);
  c.sequence_parallel = true;
  const Workload sp = bench.workload(c);
  const double ar = plain.dense.forward.collective_bytes(CollectiveOp::all_reduce, GroupKind::tensor);
  EXPECT_DOUBLE_EQ(sp.dense.forward.collective_bytes(CollectiveOp::all_gather, GroupKind::tensor), ar);
  EXPECT_DOUBLE_EQ(sp.dense.forward.collective_bytes(CollectiveOp::reduce_scatter, GroupKind::tensor), ar);
  EXPECT_EQ(sp.dense.forward.count_collectives(CollectiveOp::all_reduce, GroupKind::tensor), 0);
  // The MoE layer's router runs on this rank's s/t tokens and the all-to-all carries them.
  EXPECT_LT(sp.moe.forward.collective_bytes(CollectiveOp::all_to_all, GroupKind::expert),
            plain.moe.forward.collective_bytes(CollectiveOp::all_to_all, GroupKind::expert) * 0.3 + 1.0);
}

TEST(PipelineTimeline, StagesReportTheirLayersMemoryAndBubble) {
  test::Bench bench(test::model("ted-1.3b"), "dgx-h100");
  ParallelConfig c = test::config(16, 2, 4, 1, 64);
  c.pp = 2;
  const Prediction p = bench.evaluator.evaluate(c);
  ASSERT_EQ(p.sim.stages.size(), 2u);
  ASSERT_EQ(p.stage_memory.size(), 2u);
  EXPECT_EQ(p.stage_map.stage_layers(0) + p.stage_map.stage_layers(1), bench.m.layers);
  EXPECT_GT(p.sim.stages[1].bubble_s, 0);  // the last stage waits for the first forward
  EXPECT_NEAR(sum(p.sim.exposed), p.sim.iteration_s, 1e-9 * p.sim.iteration_s);
  EXPECT_DOUBLE_EQ(p.memory.peak, std::max(p.stage_memory[0].peak, p.stage_memory[1].peak));
}

}  // namespace
}  // namespace tedsim

namespace tedsim {
namespace {

TEST(PipelineSchedule, PeakInFlightWithoutReplayEqualsTheReplay) {
  const double uneven[] = {3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0, 3.5}, even[] = {2, 2, 2, 2, 2, 2, 2, 2};
  for (const double* bytes : {uneven, even})
  for (int pp : {2, 3, 4, 8})
    for (int vpp : {1, 2, 3, 4, 8})
      for (int m : {pp, 2 * pp, 5 * pp, 16 * pp})
        for (int stage = 0; stage < pp; ++stage)
          EXPECT_DOUBLE_EQ(peak_in_flight_bytes(stage, pp, vpp, m, bytes),
                           peak_in_flight_bytes(StageOrder(stage, pp, vpp, m), bytes))
              << "P " << pp << " V " << vpp << " m " << m << " stage " << stage;
}

}  // namespace
}  // namespace tedsim
