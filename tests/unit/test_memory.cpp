// Memory per device: parameter state against the closed form, and the parts that must move.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_helpers.hpp"
#include "tedsim/model/memory.hpp"
#include "tedsim/model/workload.hpp"

namespace tedsim {
namespace {

struct MemCase {
  int gpus, tp, ep;
};

class ZeroOneMemory : public ::testing::TestWithParam<MemCase> {};

TEST_P(ZeroOneMemory, ParameterStateMatchesClosedForm) {
  const MemCase k = GetParam();
  test::Bench bench(test::model("ted-6.7b"), "dgx-h100");
  ParallelConfig c = test::config(k.gpus, k.tp, k.ep, 1, 2 * k.gpus);
  c.zero = 1;
  const Prediction p = bench.evaluator.evaluate(c);
  const double d = c.dp(), de = c.dp_expert(), t = k.tp, e = k.ep;
  const double expected = (4 + 12 / d) * bench.m.nonexpert_params() / t + (4 + 12 / de) * bench.m.expert_params() / (t * e);
  const MemoryBreakdown& mem = p.memory;
  EXPECT_NEAR((mem.weights + mem.grads + mem.optimizer) / expected, 1.0, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Degrees, ZeroOneMemory,
                         ::testing::Values(MemCase{16, 1, 1}, MemCase{16, 2, 4}, MemCase{64, 4, 16}, MemCase{128, 8, 8},
                                           MemCase{32, 1, 16}));

// bf16 Adam moments (Megatron-Core's precision-aware optimizer): 8 optimizer bytes per parameter
// (fp32 master, bf16 m and v) instead of 12, and the step moves 8 bytes per parameter less.
TEST(Memory, Bf16AdamMomentsKeepEightBytesPerParameter) {
  test::Bench bench(test::model("ted-6.7b"), "dgx-h100");
  ParallelConfig c = test::config(16, 2, 4, 1, 32);
  c.zero = 1;
  const Prediction fp32 = bench.evaluator.evaluate(c);
  c.adam_moments = Dtype::bf16;
  const Prediction bf16 = bench.evaluator.evaluate(c);
  const double d = c.dp(), de = c.dp_expert(), t = c.tp, e = c.ep;
  const double expected = (4 + 8 / d) * bench.m.nonexpert_params() / t + (4 + 8 / de) * bench.m.expert_params() / (t * e);
  EXPECT_NEAR((bf16.memory.weights + bf16.memory.grads + bf16.memory.optimizer) / expected, 1.0, 1e-12);
  EXPECT_NEAR(bf16.memory.optimizer / fp32.memory.optimizer, 8.0 / 12.0, 1e-12);
  EXPECT_DOUBLE_EQ(bf16.memory.weights, fp32.memory.weights);
  // The step: Adam's bytes per owned parameter, 32 -> 24, priced by the same memory curve.
  const Workload w32 = bench.workload(test::config(16, 2, 4, 1, 32));
  ParallelConfig cb = test::config(16, 2, 4, 1, 32);
  cb.adam_moments = Dtype::bf16;
  const Workload w16 = bench.workload(cb);
  const double owned = 1e8;
  EXPECT_NEAR(w16.optimizer_seconds(owned * w16.shape.d, 0),
              bench.profile.kernel_seconds(KernelKind::adam, owned * 24.0, Dtype::fp32), 1e-12);
  EXPECT_NEAR(w32.optimizer_seconds(owned * w32.shape.d, 0),
              bench.profile.kernel_seconds(KernelKind::adam, owned * 32.0, Dtype::fp32), 1e-12);
}

TEST(Memory, ZeroStagesShardMoreState) {
  test::Bench bench(test::model("ted-2.7b"), "thetagpu");
  ParallelConfig c = test::config(32, 2, 4, 1, 64);
  double previous = 1e300;
  for (int zero : {0, 1, 2}) {
    c.zero = zero;
    const MemoryBreakdown m = bench.evaluator.evaluate(c).memory;
    const double state = m.weights + m.grads + m.optimizer;
    EXPECT_LT(state, previous) << "zero " << zero;
    previous = state;
  }
}

TEST(Memory, CheckpointingCacAndTilingMoveTheRightParts) {
  test::Bench bench(test::model("ted-2.7b"), "thetagpu");
  ParallelConfig c = test::config(32, 2, 4, 2, 64);
  c.recompute = Recompute::none;
  c.cac = false;
  const MemoryBreakdown full = bench.evaluator.evaluate(c).memory;
  c.recompute = Recompute::full;
  const MemoryBreakdown ckpt = bench.evaluator.evaluate(c).memory;
  EXPECT_LT(ckpt.activations, full.activations / 4);
  EXPECT_EQ(ckpt.cac_stash, 0.0);
  c.cac = true;
  const MemoryBreakdown cac = bench.evaluator.evaluate(c).memory;
  EXPECT_GT(cac.cac_stash, 0.0);
  EXPECT_DOUBLE_EQ(cac.activations, ckpt.activations);
  c.tiled_optimizer = false;
  const MemoryBreakdown untiled = bench.evaluator.evaluate(c).memory;
  EXPECT_GT(untiled.optimizer_spike, cac.optimizer_spike);
  EXPECT_LE(cac.optimizer_spike, 4.0 * kOptimizerTileElems);
}

// At tensor degree 1 there are no tensor all-reduces: CAC stashes the two all-to-alls' outputs
// of each MoE layer and nothing else.
TEST(Memory, CacAtTensorDegreeOneStashesOnlyTheAllToAlls) {
  const ModelSpec m = test::model("ted-2.7b");
  test::Bench bench(m, "thetagpu");
  ParallelConfig c = test::config(32, 1, 4, 2, 64);
  c.recompute = Recompute::full;
  c.cac = true;
  const MemoryBreakdown mem = bench.evaluator.evaluate(c).memory;
  const double T = 2.0 * m.seq_len, E = m.moe.experts;
  const double C = std::max(std::ceil(m.moe.top_k * m.moe.capacity_factor * T / E), double(m.moe.min_capacity));
  const double a2a = E * C * m.hidden * bytes_of(m.dtype);
  EXPECT_DOUBLE_EQ(mem.cac_stash, m.moe_layers() * 2.0 * a2a);
}

TEST(Memory, ActivationsFollowKorthikantiForADenseLayer) {
  ModelSpec m = test::model("ted-1.3b");
  m.set_experts(0);
  test::Bench bench(m, "thetagpu");
  ParallelConfig c = test::config(8, 2, 1, 1, 8);
  c.recompute = Recompute::none;
  const MemoryBreakdown mem = bench.evaluator.evaluate(c).memory;
  const double s = m.seq_len, b = 1, h = m.hidden, a = m.heads, t = 2;
  const double per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t));
  const double logits = s * b * (m.vocab / t) * 4.0;
  EXPECT_NEAR(mem.activations, m.layers * per_layer + logits, 1e-6 * mem.activations);
}

// Grouped-query attention keeps its key and value at their own width: Llama-3.1-70B (64 heads, 8
// key-value heads of 128) at t = 8 keeps, per token, 8 local query heads, 1 key and 1 value head
// and the 8 heads' output; the multi-head copy of the same model keeps 8 of each.
TEST(Memory, AttentionKeepsQueryKeyValueAndOutputAtTheirOwnWidths) {
  const ModelSpec gqa = test::model("hf/llama-3.1-70b");
  ModelSpec mha = gqa;
  mha.kv_heads = mha.heads;
  ParallelConfig c = test::config(8, 8, 1, 1, 8);
  c.recompute = Recompute::none;
  const StepShape s = resolve_shape(gqa, c);
  const double sb = double(s.s) * s.b, B = s.act_bytes, hd = gqa.head_dim();
  ASSERT_EQ(gqa.kv_heads, 8);
  const double difference = layer_activation_bytes(mha, c, s).dense - layer_activation_bytes(gqa, c, s).dense;
  EXPECT_NEAR(difference, B * sb * 2.0 * (64.0 / 8 - 1.0) * hd, 1e-6 * difference);
}

// DeepSeek-V3's MLA (128 heads; q_lora 1536, kv_lora 512, rope 64, qk_head_dim 192, v 128) at
// t = 1: the core's q, k (192 per head) and v (128) plus its output (128), beside the latents
// (1536 and 512 before and after their norms, and the rope key); mla_up_proj recompute drops q,
// k and v only.
TEST(Memory, MlaKeepsItsLatentsAndUpProjectedHeadsUnlessRecomputed) {
  const ModelSpec m = test::model("deepseek-v3");
  ASSERT_TRUE(m.is_mla());
  ParallelConfig c = test::config(8, 1, 8, 1, 8);
  c.recompute = Recompute::selective;
  c.recompute_modules = kRecomputeMlp;
  const StepShape s = resolve_shape(m, c);
  const double sb = double(s.s) * s.b, B = s.act_bytes;
  const LayerActivationBytes kept = layer_activation_bytes(m, c, s);
  c.recompute_modules = kRecomputeMlp | kRecomputeMlaUpProj;
  const LayerActivationBytes up = layer_activation_bytes(m, c, s);
  EXPECT_NEAR(kept.dense - up.dense, B * sb * 128.0 * (2 * 192 + 128), 1e-9 * kept.dense);
  EXPECT_NEAR(kept.moe - up.moe, B * sb * 128.0 * (2 * 192 + 128), 1e-9 * kept.moe);
  // What remains of the attention's own tensors: the output and the latents.
  ModelSpec no_latents = m;
  no_latents.mla.q_lora_rank = 0;
  no_latents.mla.kv_lora_rank = 0;
  no_latents.mla.qk_rope_head_dim = 0;
  const LayerActivationBytes bare = layer_activation_bytes(no_latents, c, s);
  EXPECT_NEAR(up.dense - bare.dense, B * sb * (2 * 1536 + 2 * 512 + 64), 1e-9 * up.dense);
}

TEST(Memory, MlaUpProjRecomputeNeedsMla) {
  const ModelSpec m = test::model("qwen3-30b-a3b");
  ParallelConfig c = test::config(8, 1, 8, 1, 8);
  c.recompute = Recompute::selective;
  c.recompute_modules = kRecomputeMlaUpProj;
  EXPECT_NE(config_violation(c, m).find("mla_up_proj needs multi-latent attention"), std::string::npos);
  EXPECT_EQ(parse_recompute_modules("mlp,mla_up_proj"), kRecomputeMlp | kRecomputeMlaUpProj);
  EXPECT_EQ(recompute_modules_text(kRecomputeMlp | kRecomputeMlaUpProj), "mlp,mla_up_proj");
}

}  // namespace
}  // namespace tedsim

namespace tedsim {
namespace {

// Weighting the expert outputs at the combine (TED's step) keeps the combine's input, every
// routed copy of the tokens [E x C, h]; Megatron-Core weights inside the experts' activation and
// keeps nothing more: DeepSeek-V3 at micro-batch 1, 4096 tokens, top-8, 7168 wide, bf16, C the
// busiest rank's per-expert rows (128 at the mean; one of its 4 local experts at the model's imbalance 1.2,
// the other three sharing the rest).
TEST(Memory, OnlyACombineThatWeightsKeepsItsInput) {
  const ModelSpec m = test::model("deepseek-v3");
  ParallelConfig c = test::config(64, 1, 64, 1, 64);
  c.recompute = Recompute::none;
  const StepShape s = resolve_shape(m, c);
  const LayerActivationBytes megatron = layer_activation_bytes(m, c, s);
  c.moe_weights_at_combine = true;
  const LayerActivationBytes ted = layer_activation_bytes(m, c, s);
  EXPECT_EQ(s.capacity, 135);  // ceil(128 x (1.2 + 3 x 254.8 / 255) / 4)
  EXPECT_DOUBLE_EQ(ted.moe - megatron.moe, 256.0 * 135 * 7168 * 2);
  EXPECT_DOUBLE_EQ(ted.dense, megatron.dense);
}

}  // namespace
}  // namespace tedsim
