// Megatron-Bridge's current MoE recipes on Blackwell: the whole step as one CUDA graph
// (--cuda-graph-scope full_iteration) and the experts as Transformer Engine's fused grouped MLP
// (--fused-grouped-mlp). What each removes from the workload, and the rules Megatron-Core holds
// them to.
#include <gtest/gtest.h>

#include <cstring>

#include "test_helpers.hpp"
#include "tedsim/model/host_launch.hpp"
#include "tedsim/model/layer_ops.hpp"
#include "tedsim/sim/simulator.hpp"

namespace tedsim {
namespace {

using test::find_op;

// GPT-OSS-120B on 64 GB200s as Megatron-Bridge 26.06 runs it: EP64, micro-batch 4, HybridEP.
ParallelConfig gpt_oss_config() {
  ParallelConfig c = test::config(64, 1, 64, 4, 1280);
  c.recompute = Recompute::none;
  c.cac = false;
  c.moe_dispatcher = MoeDispatcher::flex;
  return c;
}

ModelSpec fp8(ModelSpec m) {
  m.dtype = Dtype::fp8;
  return m;
}

TEST(FullIterationGraph, NoHostLaunchesAndNoSyncWait) {
  const test::Bench bench(fp8(test::model("gpt-oss-120b")), "gb200-nvl72");
  ParallelConfig c = gpt_oss_config();
  c.fused_grouped_mlp = true;
  const SimResult eager = simulate_iteration(bench.m, c, bench.workload(c));
  ASSERT_GT(eager.exposed[int(Phase::host_launch)], 0.0);  // Grace's eager launches and the sync cost time
  c.cuda_graph_scopes = kGraphFullIteration;
  const Workload w = bench.workload(c);
  EXPECT_EQ(find_op(w.moe.forward, "host_launch_wait"), nullptr);
  EXPECT_EQ(find_op(w.moe.backward, "host_launch_wait"), nullptr);
  const SimResult graphed = simulate_iteration(bench.m, c, w);
  EXPECT_EQ(graphed.exposed[int(Phase::host_launch)], 0.0);
  // Nothing else moves: the device's own work is the same.
  EXPECT_NEAR(graphed.busy[int(Phase::compute)], eager.busy[int(Phase::compute)], 1e-9);
  EXPECT_NEAR(graphed.iteration_s, eager.iteration_s - eager.exposed[int(Phase::host_launch)],
              1e-6 * eager.iteration_s);

  // A block of eager launches and a sync: full_iteration waits for none of it.
  Block b;
  Op op;
  op.seconds = 1e-6;
  op.host_calls = 50;
  op.host_sync = true;
  op.host_resume_calls = 45;
  b.add(op);
  EXPECT_GT(host_launch_wait(b, 10e-6, 0).wait_s, 0.0);
  EXPECT_EQ(host_launch_wait(b, 10e-6, kGraphFullIteration).wait_s, 0.0);
}

TEST(FullIterationGraph, DroplessMoeNeedsHybridEpsBudgetAndTheOpFuser) {
  const ModelSpec m = fp8(test::model("gpt-oss-120b"));
  ParallelConfig c = gpt_oss_config();
  c.cuda_graph_scopes = kGraphFullIteration;
  c.fused_grouped_mlp = true;
  EXPECT_EQ(config_violation(c, m), "");
  c.moe_dispatcher = MoeDispatcher::alltoall;
  EXPECT_NE(config_violation(c, m).find("--moe-dispatcher flex"), std::string::npos) << config_violation(c, m);
  c.moe_dispatcher = MoeDispatcher::flex;
  c.fused_grouped_mlp = false;
  EXPECT_NE(config_violation(c, m).find("--fused-grouped-mlp"), std::string::npos) << config_violation(c, m);
  // A dense model has no token counts to wait for.
  const ModelSpec dense = test::model("hf/llama-3.1-8b");
  ParallelConfig d = test::config(8, 1, 1, 1, 8);
  d.cuda_graph_scopes = kGraphFullIteration;
  EXPECT_EQ(config_violation(d, dense), "");
}

TEST(FusedGroupedMlp, TheActivationAndTheSecondQuantizationLeaveTheWorkload) {
  const test::Bench bench(fp8(test::model("gpt-oss-120b")), "gb200-nvl72");
  ParallelConfig c = gpt_oss_config();
  const Workload plain = bench.workload(c);
  c.fused_grouped_mlp = true;
  const Workload fused = bench.workload(c);
  // Unfused: the activation kernel, Megatron-Core's per-expert fc2 bias loop, fc2's input quantized.
  ASSERT_NE(find_op(plain.moe.forward, "expert_activation"), nullptr);
  ASSERT_NE(find_op(plain.moe.forward, "expert_fc2_bias"), nullptr);
  EXPECT_GT(find_op(plain.moe.forward, "expert_fc2")->quantize_bytes, 0.0);
  // Fused: the GLU (and its gradient) and the biases are in the grouped GEMMs' epilogues.
  EXPECT_EQ(find_op(fused.moe.forward, "expert_activation"), nullptr);
  EXPECT_EQ(find_op(fused.moe.backward, "expert_activation"), nullptr);
  EXPECT_EQ(find_op(fused.moe.forward, "expert_fc2_bias"), nullptr);
  const Op* fc1 = find_op(fused.moe.forward, "expert_fc1");
  const Op* fc2 = find_op(fused.moe.forward, "expert_fc2");
  ASSERT_NE(fc1, nullptr);
  ASSERT_NE(fc2, nullptr);
  EXPECT_GT(fc1->quantize_bytes, 0.0);  // the permuted tokens are still quantized before fc1
  EXPECT_EQ(fc2->quantize_bytes, 0.0);  // fc1's epilogue quantized fc2's input
  EXPECT_LT(fc2->seconds, find_op(plain.moe.forward, "expert_fc2")->seconds);
  // fc1 quantizes its input as before; its GEMM is cuDNN's, in whole 256 x 256 tiles.
  const Op* plain_fc1 = find_op(plain.moe.forward, "expert_fc1");
  EXPECT_NEAR(fc1->seconds - bench.profile.gemm_seconds(tiled_shape(fc1->gemm, kCudnnGroupedGemmTile)),
              plain_fc1->seconds - bench.profile.gemm_seconds(plain_fc1->gemm), 1e-12);
  // Backward: the first data-gradient GEMM of each pair is the dgrad (workload.cpp's mirror).
  // fc2's incoming gradient is quantized before its dgrad as before; fc1's came quantized from
  // fc2's dgrad epilogue with the GLU's gradient, so fc1's dgrad is the bare GEMM.
  const Op* fc2_dgrad = find_op(fused.moe.backward, "expert_fc2");
  const Op* fc1_dgrad = find_op(fused.moe.backward, "expert_fc1");
  ASSERT_NE(fc2_dgrad, nullptr);
  ASSERT_NE(fc1_dgrad, nullptr);
  EXPECT_GT(fc2_dgrad->quantize_bytes, 0.0);
  EXPECT_EQ(fc1_dgrad->quantize_bytes, 0.0);
  EXPECT_GT(find_op(plain.moe.backward, "expert_fc1")->quantize_bytes, 0.0);
  EXPECT_NEAR(fc1_dgrad->seconds, bench.profile.gemm_seconds(tiled_shape(fc1_dgrad->gemm, kCudnnGroupedGemmTile)), 1e-12);
  EXPECT_LT(fused.moe.forward.seconds, plain.moe.forward.seconds);
  EXPECT_LT(fused.moe.backward.seconds, plain.moe.backward.seconds);
  EXPECT_DOUBLE_EQ(fused.moe.forward.flops, plain.moe.forward.flops);  // the same GEMMs
}

// cuDNN's grouped GEMMs compute whole 256 x 256 output tiles: gpt-oss's 2880-wide outputs take
// 12 tiles (3072 columns) and its fc2 weight gradient 12 x 12; Qwen3-30B-A3B's widths (2048,
// 768, 1536) are multiples of 256 and lose nothing. The FLOPs stay the real ones.
TEST(FusedGroupedMlp, CudnnsGroupedGemmsComputeWholeTiles) {
  EXPECT_EQ(tiled_shape(GemmShape{32768, 2880, 2880, 2, Dtype::fp8}, 256).n, 3072);
  EXPECT_EQ(tiled_shape(GemmShape{100, 5760, 2880, 2, Dtype::fp8}, 256).m, 256);
  EXPECT_EQ(tiled_shape(GemmShape{100, 5760, 2880, 2, Dtype::fp8}, 0).m, 100);
  ParallelConfig c = gpt_oss_config();
  c.fused_grouped_mlp = true;
  const test::Bench oss(fp8(test::model("gpt-oss-120b")), "gb200-nvl72");
  const Workload w = oss.workload(c);
  const Op* fc2 = find_op(w.moe.forward, "expert_fc2");
  ASSERT_NE(fc2, nullptr);
  EXPECT_EQ(fc2->gemm.n, 2880);
  EXPECT_DOUBLE_EQ(fc2->flops, fc2->gemm.flops());
  GemmShape full = fc2->gemm;
  full.m = (full.m + 255) / 256 * 256;  // each expert's rows, padded to whole tiles too
  full.n = 3072;
  EXPECT_NEAR(fc2->seconds, oss.profile.gemm_seconds(full), 1e-12);
  EXPECT_GT(fc2->seconds, oss.profile.gemm_seconds(fc2->gemm));
  ParallelConfig q = test::config(8, 1, 8, 4, 512);
  q.recompute = Recompute::none;
  q.cac = false;
  q.moe_dispatcher = MoeDispatcher::flex;
  q.fused_grouped_mlp = true;
  const test::Bench qwen(fp8(test::model("qwen3-30b-a3b")), "gb200-nvl72");
  const Workload qw = qwen.workload(q);
  for (const char* name : {"expert_fc1", "expert_fc2"}) {
    const Op* op = find_op(qw.moe.forward, name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(tiled_shape(op->gemm, kCudnnGroupedGemmTile).n, op->gemm.n) << name;
  }
}

TEST(FusedGroupedMlp, TheRulesTransformerEngineAndMegatronCoreHold) {
  const ModelSpec m = fp8(test::model("gpt-oss-120b"));
  ParallelConfig c = gpt_oss_config();
  c.fused_grouped_mlp = true;
  EXPECT_EQ(config_violation(c, m), "");
  EXPECT_NE(config_violation(c, test::model("gpt-oss-120b")).find("MXFP8"), std::string::npos);  // bf16
  EXPECT_NE(config_violation(c, test::model("hf/llama-3.1-8b")).find("dense"), std::string::npos);
  ParallelConfig etp = c;
  etp.gpus = 128;
  etp.tp = 2;
  etp.expert_tp = true;
  EXPECT_NE(config_violation(etp, m).find("--no-expert-tp"), std::string::npos) << config_violation(etp, m);
  etp.expert_tp = false;
  EXPECT_EQ(config_violation(etp, m), "");
  ParallelConfig act = c;
  act.recompute = Recompute::selective;
  act.recompute_modules = kRecomputeMoeAct;
  EXPECT_NE(config_violation(act, m).find("moe_act"), std::string::npos);
}

}  // namespace
}  // namespace tedsim
