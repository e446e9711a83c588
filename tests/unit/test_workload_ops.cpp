// Ops of the workload: dropout (the attention-probability kernel and the mask byte of the fused
// bias-dropout-add) only for models that train with it, the model file's dropout keys, and the
// longest block within Block::kMaxOps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/memory.hpp"
#include "tedsim/model/workload.hpp"

namespace tedsim {
namespace {

using test::find_op;

TEST(Dropout, AttentionDropoutIsAKernelOnTheProbabilitiesAndHiddenDropoutAMaskByte) {
  ModelSpec m = test::model("published/megatron-gpt-1.7b");
  ASSERT_DOUBLE_EQ(m.attention_dropout, 0.1);
  ASSERT_DOUBLE_EQ(m.hidden_dropout, 0.1);
  const test::Bench with(m, "selene");
  ModelSpec plain = m;
  plain.hidden_dropout = plain.attention_dropout = 0;
  const test::Bench without(plain, "selene");
  const ParallelConfig c = test::config(8, 2, 1, 1, 64);
  const Workload w = with.workload(c), p = without.workload(c);
  const Op* drop = find_op(w.dense.forward, "attn_dropout");
  ASSERT_NE(drop, nullptr);
  EXPECT_EQ(find_op(p.dense.forward, "attn_dropout"), nullptr);
  // [b, heads/t, s, s] read and written in fp16, plus a one-byte mask.
  EXPECT_DOUBLE_EQ(drop->bytes, 5.0 * 1 * (24 / 2) * 2048.0 * 2048.0);
  EXPECT_NE(find_op(w.dense.backward, "attn_dropout"), nullptr);  // its backward reads the mask
  // The residual adds carry the mask byte: 3 fp16 tensors [s, h] and 1 byte per element.
  EXPECT_DOUBLE_EQ(find_op(w.dense.forward, "residual_attn")->bytes, 7.0 * 2048 * 2304);
  EXPECT_DOUBLE_EQ(find_op(p.dense.forward, "residual_attn")->bytes, 6.0 * 2048 * 2304);
  EXPECT_GT(w.dense.forward.seconds, p.dense.forward.seconds);
}

// RoPE rotates every local query head and every local key head once, read and written; MLA
// rotates its rope part of each query head and the one rope key its heads share.
TEST(Rotary, RotatesTheLocalQueryAndKeyHeadsOnce) {
  const ParallelConfig c = test::config(16, 2, 1, 1, 16);
  {
    const ModelSpec m = test::model("hf/llama-3.1-70b");  // 64 heads, 8 key heads, head_dim 128
    const test::Bench bench(m, "dgx-h100");
    const Workload w = bench.workload(c);
    const Op* rope = find_op(w.dense.forward, "rotary");
    ASSERT_NE(rope, nullptr);
    const double T = double(w.shape.tokens);
    EXPECT_DOUBLE_EQ(rope->bytes, 2.0 * T * 128 * (64 / 2 + 8 / 2) * w.shape.act_bytes);
    EXPECT_NE(find_op(w.dense.backward, "rotary"), nullptr);
  }
  {
    const ModelSpec m = test::model("hf/deepseek-v3");  // 128 heads, qk_rope_head_dim 64
    const test::Bench bench(m, "dgx-h100");
    const Workload w = bench.workload(c);
    const Op* rope = find_op(w.moe.forward, "rotary");
    ASSERT_NE(rope, nullptr);
    EXPECT_DOUBLE_EQ(rope->bytes, 2.0 * double(w.shape.tokens) * 64 * (128 / 2 + 1) * w.shape.act_bytes);
  }
  const test::Bench gpt(test::model("ted-6.7b"), "summit");
  EXPECT_EQ(find_op(gpt.workload(c).dense.forward, "rotary"), nullptr);
}

// gpt-oss's YaRN attention factor (1.35) sends Megatron-Core to its unfused RoPE: 12 reads and
// writes per rotated element forward, 13 backward, and 12 / 7 framework calls per tensor, where
// the fused kernel reads and writes each once. The same model with a factor of 1 runs it fused.
TEST(Rotary, YarnsAttentionFactorRunsTheUnfusedRopeWithItsTrafficAndCalls) {
  const ParallelConfig c = test::config(8, 1, 8, 1, 8);
  const ModelSpec oss = test::model("hf/gpt-oss-120b");  // 64 heads, 8 key heads, head_dim 64
  ASSERT_TRUE(oss.rope_unfused());
  ModelSpec fused = oss;
  fused.rope_attention_factor = 1.0;
  const Workload u = test::Bench(oss, "dgx-b200").workload(c);
  const Workload f = test::Bench(fused, "dgx-b200").workload(c);
  const double rotated = double(u.shape.tokens) * 64 * (64 + 8) * u.shape.act_bytes;
  for (const LayerBlocks* kind : {&u.moe, &u.moe_window}) {
    const Op* fwd = find_op(kind->forward, "rotary");
    const Op* bwd = find_op(kind->backward, "rotary");
    ASSERT_NE(fwd, nullptr);
    ASSERT_NE(bwd, nullptr);
    EXPECT_DOUBLE_EQ(fwd->bytes, 12.0 * rotated);
    EXPECT_DOUBLE_EQ(bwd->bytes, 13.0 * rotated);
    EXPECT_DOUBLE_EQ(fwd->host_calls, 24.0);
    EXPECT_DOUBLE_EQ(bwd->host_calls, 14.0);
  }
  const Op* plain = find_op(f.moe.forward, "rotary");
  ASSERT_NE(plain, nullptr);
  EXPECT_DOUBLE_EQ(plain->bytes, 2.0 * rotated);
  EXPECT_DOUBLE_EQ(plain->host_calls, 1.0);
  EXPECT_GT(u.moe.forward.seconds, f.moe.forward.seconds);
  EXPECT_GT(u.moe.backward.seconds, f.moe.backward.seconds);
}

// gpt-oss's clamped GLU (swiglu_limit 7) outside Megatron-Core's fused bias-GLU: four passes of
// fc1's output forward and five backward, in the moe_act recompute module, and one more fc1
// output kept; the fused grouped MLP clamps in its epilogue, and a model without a limit has none.
TEST(ActivationClamp, ClampsAndConcatenatesTheGluHalvesOutsideTheFusedKernel) {
  const ModelSpec oss = test::model("hf/gpt-oss-120b");
  ASSERT_EQ(oss.activation_clamp, 7.0);
  ASSERT_EQ(test::model("gpt-oss-120b").activation_clamp, 7.0);  // the YAML says the same
  ModelSpec plain = oss;
  plain.activation_clamp = 0;
  ParallelConfig c = test::config(8, 1, 8, 1, 8);
  c.recompute = Recompute::none;
  const test::Bench bench(oss, "dgx-b200");
  const Workload w = bench.workload(c);
  const Op* fwd = find_op(w.moe.forward, "expert_act_clamp");
  const Op* bwd = find_op(w.moe.backward, "expert_act_clamp");
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  const StepShape& s = w.shape;
  const double fc1_bytes = double(s.expert_rows) * s.local_experts * 2.0 * s.ffn_local * s.act_bytes;
  EXPECT_DOUBLE_EQ(fwd->bytes, 4.0 * fc1_bytes);
  EXPECT_DOUBLE_EQ(bwd->bytes, 5.0 * fc1_bytes);
  EXPECT_EQ(fwd->module, kRecomputeMoe | kRecomputeMoeAct);
  EXPECT_EQ(find_op(test::Bench(plain, "dgx-b200").workload(c).moe.forward, "expert_act_clamp"), nullptr);
  // Memory: fc1's output once more, unless moe_act is recomputed.
  const LayerActivationBytes clamped = layer_activation_bytes(oss, c, s);
  const LayerActivationBytes unclamped = layer_activation_bytes(plain, c, s);
  EXPECT_DOUBLE_EQ(clamped.moe - unclamped.moe, fc1_bytes);
  ParallelConfig act = c;
  act.recompute = Recompute::selective;
  act.recompute_modules = kRecomputeMoeAct;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(oss, act, s).moe, layer_activation_bytes(plain, act, s).moe);
  // The fused grouped MLP (MXFP8) clamps inside its first GEMM's epilogue.
  ModelSpec mx = oss;
  mx.dtype = Dtype::fp8;
  ParallelConfig fused = c;
  fused.fused_grouped_mlp = true;
  EXPECT_EQ(find_op(test::Bench(mx, "gb200-nvl72").workload(fused).moe.forward, "expert_act_clamp"), nullptr);
}

// The experts' GEMMs, forward and backward, are grouped (each expert multiplies its own weights,
// GemmShape::grouped); the unfused attention core's batched products are not, nor is any dense GEMM.
TEST(GroupedGemm, OnlyTheExpertsGemmsAreGrouped) {
  ParallelConfig c = test::config(2, 2, 1, 2, 8);
  c.recompute = Recompute::none;
  const test::Bench bench(test::model("cpu-qwen-moe"), "local-cpu");  // unfused attention core
  const Workload w = bench.workload(c);
  int grouped = 0, batched = 0;
  for (const Block* b : {&w.moe.forward, &w.moe.backward})
    for (int i = 0; i < b->count; ++i) {
      const Op& op = b->ops[i];
      if (op.flops <= 0 || op.is_attention) continue;
      const bool expert = std::strncmp(op.name, "expert_fc", 9) == 0;
      EXPECT_EQ(op.gemm.grouped, expert) << op.name;
      grouped += op.gemm.grouped;
      batched += !expert && op.gemm.batch > 1;
    }
  EXPECT_EQ(grouped, 2 + 4);  // fc1 and fc2: forward, and two GEMMs each in backward
  EXPECT_GT(batched, 0);          // attn_scores, attn_context
}

// Qwen3 normalizes every local query and key head before RoPE (read and written once, and back
// in backward); OLMoE its whole projections, the same elements; Llama and Mixtral neither.
TEST(QkNorm, NormalizesTheLocalQueryAndKeyHeads) {
  const ParallelConfig c = test::config(16, 2, 1, 1, 16);
  for (const char* name : {"hf/qwen3-30b-a3b", "qwen3-30b-a3b"}) {  // 32 heads, 4 key heads, head_dim 128
    const ModelSpec m = test::model(name);
    EXPECT_EQ(m.qk_norm, QkNorm::head) << name;
    const test::Bench bench(m, "dgx-h100");
    const Workload w = bench.workload(c);
    const Op* norm = find_op(w.moe.forward, "qk_norm");
    ASSERT_NE(norm, nullptr) << name;
    EXPECT_EQ(norm->kernel, KernelKind::layernorm);
    EXPECT_DOUBLE_EQ(norm->bytes, 2.0 * double(w.shape.tokens) * 128 * (32 / 2 + 4 / 2) * w.shape.act_bytes);
    EXPECT_NE(find_op(w.moe.backward, "qk_norm"), nullptr);
  }
  EXPECT_EQ(test::model("hf/olmoe-1b-7b").qk_norm, QkNorm::projection);
  EXPECT_EQ(test::model("olmoe-1b-7b").qk_norm, QkNorm::projection);
  for (const char* name : {"hf/llama-3.1-70b", "hf/mixtral-8x7b", "hf/deepseek-v3"}) {
    const ModelSpec m = test::model(name);
    EXPECT_EQ(m.qk_norm, QkNorm::none) << name;
    const test::Bench bench(m, "dgx-h100");
    EXPECT_EQ(find_op(bench.workload(c).dense.forward, "qk_norm"), nullptr) << name;
  }
}

// gpt-oss's experts have biases. Megatron-Core adds fc2's per local expert in a Python loop, in
// fp32 (experts.py:250-268): 28 bytes per output element forward and 36 backward at bf16, two
// calls per expert forward and five backward. Models without biases and TED's own step (which
// weights at the combine) have no such op.
TEST(ExpertBias, MegatronCoreAddsTheSecondBiasExpertByExpertInFp32) {
  const ModelSpec m = test::model("gpt-oss-120b");
  ASSERT_TRUE(m.linear_bias);
  const test::Bench bench(m, "dgx-b200");
  ParallelConfig c = test::config(64, 1, 8, 4, 1280);
  c.recompute = Recompute::none;
  const Workload w = bench.workload(c);
  ASSERT_EQ(w.shape.local_experts, 16);
  const double elements = double(w.shape.expert_rows) * w.shape.local_experts * m.hidden;
  const Op* fwd = find_op(w.moe.forward, "expert_fc2_bias");
  const Op* bwd = find_op(w.moe.backward, "expert_fc2_bias");
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  EXPECT_DOUBLE_EQ(fwd->bytes, 28.0 * elements);
  EXPECT_DOUBLE_EQ(bwd->bytes, 36.0 * elements);
  EXPECT_DOUBLE_EQ(fwd->host_calls, 34.0);
  EXPECT_DOUBLE_EQ(bwd->host_calls, 81.0);
  EXPECT_GT(bwd->seconds, fwd->seconds);
  // The op sits right after fc2, before the combine's all-to-all.
  int fc2 = -1, bias = -1;
  for (int i = 0; i < w.moe.forward.count; ++i) {
    if (std::strcmp(w.moe.forward.ops[i].name, "expert_fc2") == 0) fc2 = i;
    if (std::strcmp(w.moe.forward.ops[i].name, "expert_fc2_bias") == 0) bias = i;
  }
  EXPECT_EQ(bias, fc2 + 1);

  ParallelConfig ted = c;
  ted.moe_weights_at_combine = true;
  EXPECT_EQ(find_op(bench.workload(ted).moe.forward, "expert_fc2_bias"), nullptr);
  const test::Bench unbiased(test::model("qwen3-30b-a3b"), "dgx-b200");
  EXPECT_EQ(find_op(unbiased.workload(c).moe.forward, "expert_fc2_bias"), nullptr);
}

TEST(Dropout, ProbabilitiesOutsideZeroToOneAreRejectedWithTheKey) {
  const std::string path = ::testing::TempDir() + "tedsim_dropout.yaml";
  for (const char* bad : {"attention_dropout: 1.0", "hidden_dropout: -0.1"}) {
    std::ofstream(path) << "name: d\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 128\nseq_len: 32\n" << bad << "\n";
    try {
      load_model(path);
      FAIL() << "accepted " << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad).substr(0, std::string(bad).find(':'))), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace tedsim

namespace tedsim {
namespace {

// The longest block (an MoE backward with every optional op) fits Block::kMaxOps with room.
TEST(BlockCapacity, TheLongestMoeBlockFits) {
  int longest = 0;
  for (const char* name : {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b", "gpt-oss-120b"}) {
    const test::Bench bench(test::model(name), "dgx-h100");
    for (int tp : {1, 2, 8})
      for (int ep : {1, 8})
        for (bool sp : {false, true})
          for (bool dtd : {false, true}) {
            ParallelConfig c = test::config(64, tp, ep, 1, 64);
            c.sequence_parallel = sp && tp > 1;
            c.dtd = dtd && !c.sequence_parallel;
            c.recompute = Recompute::full;
            const Workload w = bench.workload(c);
            for (const Block* b : {&w.moe.forward, &w.moe.recompute, &w.moe.backward}) longest = std::max(longest, b->count);
          }
  }
  std::printf("longest MoE block: %d ops (Block::kMaxOps %d)\n", longest, Block::kMaxOps);
  EXPECT_LE(longest + 8, Block::kMaxOps);
}

}  // namespace
}  // namespace tedsim
