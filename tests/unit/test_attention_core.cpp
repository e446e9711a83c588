// The attention core priced as one measured kernel: a topology's efficiency.attention tables
// (flash forward/backward, unfused forward + backward), the analytic profile's lookup against
// hand-computed times, the workload's ops and the activation memory of a fused core.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/memory.hpp"
#include "tedsim/model/workload.hpp"

namespace tedsim {
namespace {

// selene's machine with attention tables of round numbers.
std::string topology_text(const std::string& attention_block) {
  return R"(name: attn-test
device:
  kind: gpu
  name: test GPU
  memory_gib: 80
  peak_tflops: {fp32: 19.5, fp16: 312, bf16: 312}
  memory_bandwidth_gbs: 2039
devices_per_node: 8
intra_node: {bandwidth_gbs: 300, latency_us: 1}
inter_node: {bandwidth_gbs: 200, latency_us: 5}
efficiency:
  gemm_by_flops: [[1.0e6, 0.2], [1.0e12, 0.8]]
  gemm_by_min_dim: [[16, 0.5], [1024, 1.0]]
  memory_by_bytes: [[1024, 0.1], [1.0e9, 0.9]]
)" + attention_block;
}

const std::string kTables = R"(  attention:
    flash_forward_d64: [[1024, 100], [4096, 200]]
    flash_backward_d64: [[1024, 50], [4096, 100]]
    flash_forward_d128: [[1024, 150], [4096, 300]]
    flash_backward_d128: [[1024, 75], [4096, 150]]
    unfused_d128: [[1024, 40], [4096, 80]]
)";

using test::find_op;

TEST(AttentionCore, FlashTimesAreTheCausalHalfOfTheSquareAtTheTablesRate) {
  const AnalyticProfile p(topology_from_yaml_text(topology_text(kTables), "attn-test"));
  const AttentionShape s{8, 2048, 128, 128};
  const double F = 2.0 * 8 * 2048.0 * 2048.0 * 256;  // QK^T and PV over the whole square
  ASSERT_DOUBLE_EQ(s.forward_flops(), F);
  // 2048 lies halfway between 1024 and 4096 in log: 225 TFLOP/s forward, 112.5 backward.
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, s), 0.5 * F / 225e12, 1e-12);
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, true, s), 2.5 * 0.5 * F / 112.5e12, 1e-12);
  // Head dim 96: log-interpolated between the d64 (150 at s=2048) and d128 (225) rates.
  const AttentionShape s96{8, 2048, 96, 96};
  const double f = std::log(96.0 / 64.0) / std::log(2.0);
  const double rate = (1 - f) * 150 + f * 225;
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, s96), 0.5 * s96.forward_flops() / (rate * 1e12), 1e-12);
  // Outside the table: clamped.
  const AttentionShape longer{8, 16384, 128, 128};
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, longer), 0.5 * longer.forward_flops() / 300e12, 1e-12);
}

// A sliding window of w keys over s queries: the band holds w(w+1)/2 + (s - w) w pairs, which the
// fused kernel computes at the rate of a causal core of length w; an unfused core still computes
// and masks the whole square.
TEST(AttentionCore, ASlidingWindowComputesItsBandAtTheWindowsRate) {
  const AnalyticProfile p(topology_from_yaml_text(topology_text(kTables), "attn-test"));
  const AttentionShape full{8, 4096, 128, 128};
  AttentionShape window = full;
  window.window = 2048;
  const double pairs = 2048.0 * 2049.0 / 2.0 + (4096.0 - 2048.0) * 2048.0;
  ASSERT_DOUBLE_EQ(window.square(), 2.0 * pairs);
  ASSERT_DOUBLE_EQ(window.forward_flops(), 2.0 * 8 * 2.0 * pairs * 256);
  // The window's 2048 keys: the tables' 225 TFLOP/s forward (the full core runs at 300, 4096's).
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, window), pairs * 2.0 * 8 * 256 / 225e12, 1e-12);
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, full), 0.5 * full.forward_flops() / 300e12, 1e-12);
  // A window as long as the sequence is full causal attention.
  AttentionShape long_window = full;
  long_window.window = 4096;
  EXPECT_DOUBLE_EQ(p.attention_seconds(AttentionKernel::flash, true, long_window), p.attention_seconds(AttentionKernel::flash, true, full));
  // Unfused: the whole square either way.
  EXPECT_DOUBLE_EQ(p.attention_seconds(AttentionKernel::unfused, false, window), p.attention_seconds(AttentionKernel::unfused, false, full));
}

// gpt-oss windows the odd layers (1-based): their blocks carry the windowed core, and a stage's
// layers take their own kind's blocks.
TEST(AttentionCore, WindowedLayersTakeTheirOwnBlocks) {
  ModelSpec m = test::model("gpt-oss-120b");
  m.core_attention = AttentionKernel::flash;  // Transformer Engine's, as --attention-kernel auto picks on H100
  test::Bench bench(m, "dgx-h100");
  ParallelConfig c = test::config(8, 1, 8, 1, 8);
  c.recompute = Recompute::none;
  const Workload w = bench.workload(c);
  ASSERT_TRUE(w.windowed);
  EXPECT_EQ(&w.layer_blocks(m, 0), &w.moe_window);
  EXPECT_EQ(&w.layer_blocks(m, 1), &w.moe);
  const auto core_of = [](const Block& b) {
    for (int i = 0; i < b.count; ++i)
      if (std::strcmp(b.ops[i].name, "attn_core") == 0) return &b.ops[i];
    return static_cast<const Op*>(nullptr);
  };
  const Op* full = core_of(w.moe.forward);
  const Op* windowed = core_of(w.moe_window.forward);
  ASSERT_TRUE(full && windowed);
  EXPECT_EQ(windowed->attention_window, 128);
  EXPECT_EQ(full->attention_window, 0);
  AttentionShape shape = full->attention_shape();
  shape.window = 128;
  EXPECT_DOUBLE_EQ(windowed->seconds, bench.profile.attention_seconds(AttentionKernel::flash, false, shape));
  EXPECT_LT(windowed->seconds, 0.2 * full->seconds);  // 1/16 of the pairs, at a short core's lower rate
  // Everything but the core is the same op for op.
  EXPECT_NEAR(w.moe_window.forward.seconds - windowed->seconds, w.moe.forward.seconds - full->seconds, 1e-12);
  // At a sequence no longer than the window, no windowed blocks are built.
  c.seq_len = 128;
  EXPECT_FALSE(bench.workload(c).windowed);
}

TEST(AttentionCore, UnfusedTimesAreTheWholeSquareSplitByFlops) {
  const AnalyticProfile p(topology_from_yaml_text(topology_text(kTables), "attn-test"));
  const AttentionShape s{8, 2048, 128, 128};
  // The forward + backward rate, 60 TFLOP/s at 2048; the only head dim measured serves every one.
  const double total = 3.5 * s.forward_flops() / 60e12;
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::unfused, false, s), total / 3.5, 1e-12);
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::unfused, true, s), total * 2.5 / 3.5, 1e-12);
  const AttentionShape s64{8, 2048, 64, 64};
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::unfused, false, s64), s64.forward_flops() / 60e12, 1e-12);
}

TEST(AttentionCore, WithoutTablesTheProfileHasNoPrice) {
  const AnalyticProfile p(topology_from_yaml_text(topology_text(""), "attn-test"));
  EXPECT_LT(p.attention_seconds(AttentionKernel::flash, false, AttentionShape{8, 2048, 128, 128}), 0);
  EXPECT_LT(p.attention_seconds(AttentionKernel::unfused, true, AttentionShape{8, 2048, 128, 128}), 0);
}

TEST(AttentionCore, BadTablesNameTheKey) {
  const auto error_of = [](const std::string& block) {
    try {
      topology_from_yaml_text(topology_text(block), "attn-test");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("  attention:\n    flash_forward_d128: [[1024, 150]]\n").find("efficiency.attention.flash_backward_d128"),
            std::string::npos);
  EXPECT_NE(error_of("  attention:\n    unfused_d96: [[1024, 40]]\n").find("unknown key 'efficiency.attention.unfused_d96'"),
            std::string::npos);
  const std::string negative = error_of("  attention:\n    unfused_d64: [[1024, -4]]\n");
  EXPECT_NE(negative.find("efficiency.attention.unfused_d64"), std::string::npos) << negative;
  EXPECT_NE(error_of("  attention: {}\n").find("expected at least one table"), std::string::npos);
}

struct AttentionBench {
  ModelSpec m;
  TopologySpec topo;
  AnalyticProfile profile;
  Evaluator evaluator;
  AttentionBench(ModelSpec model, const std::string& tables)
      : m(std::move(model)),
        topo(topology_from_yaml_text(topology_text(tables), "attn-test")),
        profile(topo),
        evaluator(m, topo, profile) {}
  Workload workload(const ParallelConfig& c) const { return build_workload(m, c, profile, evaluator.spans_for(c)); }
};

TEST(AttentionCore, FlashIsOneOpForwardOneBackwardAndNoLayoutCopies) {
  ModelSpec m = test::model("hf/llama-3.1-70b");  // 64 heads of 128, 8 key heads
  m.core_attention = AttentionKernel::flash;
  const AttentionBench bench(m, kTables);
  ParallelConfig c = test::config(16, 2, 1, 1, 16);
  c.seq_len = 2048;
  c.recompute = Recompute::selective;
  c.recompute_modules = kRecomputeCoreAttn;
  const Workload w = bench.workload(c);
  const Op* fwd = find_op(w.dense.forward, "attn_core");
  ASSERT_NE(fwd, nullptr);
  for (const char* gone : {"attn_scores", "attn_softmax", "attn_context", "attn_split_heads", "attn_merge_heads"})
    EXPECT_EQ(find_op(w.dense.forward, gone), nullptr) << gone;
  const AttentionShape core{1 * 32, 2048, 128, 128};  // micro-batch 1, 64 heads over t = 2
  EXPECT_DOUBLE_EQ(fwd->flops, core.forward_flops());
  EXPECT_DOUBLE_EQ(fwd->seconds, bench.profile.attention_seconds(AttentionKernel::flash, false, core));
  const Op* bwd = find_op(w.dense.backward, "attn_core");
  ASSERT_NE(bwd, nullptr);
  EXPECT_DOUBLE_EQ(bwd->flops, 2 * core.forward_flops());
  EXPECT_DOUBLE_EQ(bwd->seconds, bench.profile.attention_seconds(AttentionKernel::flash, true, core));
  // Selective recompute of the core replays its forward.
  const Op* again = find_op(w.dense.recompute, "attn_core");
  ASSERT_NE(again, nullptr);
  EXPECT_DOUBLE_EQ(again->seconds, fwd->seconds);
}

TEST(AttentionCore, UnfusedWithATableKeepsItsLayoutCopiesAndDropout) {
  ModelSpec m = test::model("published/megatron-gpt-1.7b");  // attention dropout 0.1, head dim 96
  const AttentionBench bench(m, kTables);
  const Workload w = bench.workload(test::config(8, 2, 1, 1, 64));
  EXPECT_NE(find_op(w.dense.forward, "attn_core"), nullptr);
  EXPECT_NE(find_op(w.dense.forward, "attn_split_heads"), nullptr);
  EXPECT_NE(find_op(w.dense.forward, "attn_dropout"), nullptr);
  EXPECT_NE(find_op(w.dense.forward, "attn_merge_heads"), nullptr);
  EXPECT_EQ(find_op(w.dense.forward, "attn_scores"), nullptr);
  // Without a table, op by op as before.
  const AttentionBench plain(m, "");
  const Workload p = plain.workload(test::config(8, 2, 1, 1, 64));
  EXPECT_EQ(find_op(p.dense.forward, "attn_core"), nullptr);
  EXPECT_NE(find_op(p.dense.forward, "attn_scores"), nullptr);
  EXPECT_NE(find_op(p.dense.forward, "attn_context"), nullptr);
  // The FLOPs are the same either way.
  EXPECT_DOUBLE_EQ(w.dense.forward.flops, p.dense.forward.flops);
  EXPECT_DOUBLE_EQ(w.dense.backward.flops, p.dense.backward.flops);
}

TEST(AttentionCore, FlashIsAnErrorWhereTheProfileCannotPriceIt) {
  ModelSpec m = test::model("hf/llama-3.1-70b");
  m.core_attention = AttentionKernel::flash;
  const AttentionBench bench(m, "");
  EXPECT_THROW(bench.workload(test::config(16, 2, 1, 1, 16)), InputError);
}

// Korthikanti et al. 2022's 5as^2b/t of the softmax input, output and dropout mask is what a fused
// core never holds; it keeps each row's fp32 log-sum-exp instead.
TEST(AttentionCore, FlashDropsTheSquareFromTheActivations) {
  ModelSpec m = test::model("hf/llama-3.1-70b");
  const ParallelConfig c = test::config(16, 2, 1, 1, 16);
  const StepShape s = resolve_shape(m, c);
  const LayerActivationBytes unfused = layer_activation_bytes(m, c, s);
  m.core_attention = AttentionKernel::flash;
  const LayerActivationBytes flash = layer_activation_bytes(m, c, s);
  const double a = m.heads, sb = double(s.s) * s.b, t = s.t;
  const double square = s.act_bytes / 2.0 * 5.0 * a * s.s * sb / t, lse = 4.0 * a * sb / t;
  EXPECT_NEAR(unfused.dense - flash.dense, square - lse, 1e-6 * square);
  EXPECT_NEAR(unfused.dense_full - flash.dense_full, square - lse, 1e-6 * square);
}


// FP8 attention (--fp8-attention): cuDNN's FP8 kernel from the topology's flash_fp8_* tables; its
// backward prices a windowed layer as the whole causal core (cuDNN's FP8 backward does not skip the
// tiles outside the window). Without the tables the profile cannot price it.
TEST(AttentionCore, Fp8AttentionTakesItsOwnTablesAndItsBackwardIgnoresTheWindow) {
  const std::string fp8_tables = kTables + R"(    flash_fp8_forward_d128: [[1024, 300], [4096, 600]]
    flash_fp8_backward_d128: [[1024, 60], [4096, 120]]
)";
  const AnalyticProfile p(topology_from_yaml_text(topology_text(fp8_tables), "attn-test"));
  AttentionShape s{8, 4096, 128, 128};
  const double bf16_forward = p.attention_seconds(AttentionKernel::flash, false, s);
  s.fp8 = true;
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, s), 0.5 * s.forward_flops() / 600e12, 1e-12);
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, s), 0.5 * bf16_forward, 1e-12);  // 600 against 300
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, true, s), 2.5 * 0.5 * s.forward_flops() / 120e12, 1e-12);
  // A 1024-token window: forward over the band at the window's rate, backward over the whole core.
  AttentionShape w = s;
  w.window = 1024;
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, false, w), 0.5 * w.forward_flops() / 300e12, 1e-12);
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, true, w), p.attention_seconds(AttentionKernel::flash, true, s),
              1e-12);
  // bf16 skips the tiles outside the band: its backward there is the band's pairs (3.67M of the
  // causal half's 8.39M) at the window's rate (75 TFLOP/s), cheaper than FP8's whole core at 120.
  const double fp8_windowed = p.attention_seconds(AttentionKernel::flash, true, w);
  w.fp8 = false;
  EXPECT_NEAR(p.attention_seconds(AttentionKernel::flash, true, w), 2.5 * 0.5 * w.forward_flops() / 75e12, 1e-12);
  EXPECT_LT(p.attention_seconds(AttentionKernel::flash, true, w), fp8_windowed);
  // No FP8 tables: no FP8 price.
  const AnalyticProfile bf16_only(topology_from_yaml_text(topology_text(kTables), "attn-test"));
  EXPECT_LT(bf16_only.attention_seconds(AttentionKernel::flash, false, s), 0);
  // The tables come in pairs, beside bf16 ones.
  EXPECT_THROW(topology_from_yaml_text(topology_text(kTables + "    flash_fp8_forward_d128: [[1024, 300]]\n"), "x"),
               InputError);
}

// The workload prices the core in FP8 where the plan asks, forward and backward (the mirror keeps
// the flag); GB200's shipped tables make MXFP8 attention faster forward at head dim 128.
TEST(AttentionCore, TheWorkloadCarriesFp8AttentionIntoBackward) {
  ModelSpec m = test::model("qwen3-30b-a3b");
  m.dtype = Dtype::fp8;
  m.core_attention = AttentionKernel::flash;
  const test::Bench bench(m, "gb200-nvl72");
  ParallelConfig c = test::config(8, 1, 8, 1, 64);
  c.recompute = Recompute::none;
  c.cac = false;
  const Workload bf16 = bench.workload(c);
  c.fp8_attention = true;
  EXPECT_EQ(config_violation(c, bench.m), "");
  const Workload fp8 = bench.workload(c);
  const Op* f = find_op(fp8.moe.forward, "attn_core");
  const Op* b = find_op(fp8.moe.backward, "attn_core");
  ASSERT_NE(f, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(f->attention_fp8);
  EXPECT_TRUE(b->attention_fp8);
  EXPECT_LT(f->seconds, find_op(bf16.moe.forward, "attn_core")->seconds);
  EXPECT_NEAR(b->seconds, bench.profile.attention_seconds(AttentionKernel::flash, true, f->attention_shape()), 1e-15);
  ModelSpec bf16_model = test::model("qwen3-30b-a3b");
  EXPECT_NE(config_violation(c, bf16_model).find("--dtype fp8"), std::string::npos);
}

}  // namespace
}  // namespace tedsim
