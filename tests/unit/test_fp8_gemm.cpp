// FP8 GEMMs on the analytic profile: the topology's fp8_gemm_scale_by_flops scales the bf16
// curve's efficiency for FP8 GEMMs at the FP8 peak (hand-computed here), and bad scales are
// named by key. Transformer Engine's quantization kernels around each FP8 linear: their bytes per
// recipe, in forward (input) and backward (output gradient), and none for bf16 or the GEMMs that
// do not run in FP8.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/layer_ops.hpp"
#include "tedsim/model/workload.hpp"
#include "tedsim/profile/analytic_profile.hpp"

namespace tedsim {
namespace {

std::string topology_text(const std::string& extra, const std::string& peaks = "{fp32: 67, bf16: 1000, fp8: 2000}") {
  return R"(name: fp8-test
device:
  kind: gpu
  name: test GPU
  memory_gib: 80
  peak_tflops: )" + peaks + R"(
  memory_bandwidth_gbs: 3000
devices_per_node: 8
intra_node: {bandwidth_gbs: 450, latency_us: 1}
inter_node: {bandwidth_gbs: 400, latency_us: 5}
efficiency:
  gemm_by_flops: [[1.0e6, 0.5], [1.0e12, 0.5]]
  gemm_by_min_dim: [[1, 1.0], [1024, 1.0]]
  memory_by_bytes: [[1024, 0.5], [1.0e9, 0.5]]
)" + extra;
}

TEST(Fp8Gemm, TheScaleCurveMultipliesTheBf16EfficiencyAtTheFp8Peak) {
  const AnalyticProfile p(topology_from_yaml_text(
      topology_text("  fp8_gemm_scale_by_flops: [[1.0e9, 0.5], [1.0e11, 0.9]]\n"), "fp8-test"));
  const GemmShape big{4096, 4096, 4096, 1, Dtype::fp8};  // 1.37e11 FLOPs: the curve's last point holds
  EXPECT_NEAR(p.gemm_seconds(big), big.flops() / (2000e12 * 0.5 * 0.9), 1e-12);
  GemmShape bf16 = big;
  bf16.dtype = Dtype::bf16;
  EXPECT_NEAR(p.gemm_seconds(bf16), bf16.flops() / (1000e12 * 0.5), 1e-12);
  // 1e10 FLOPs lies halfway in log between the points: scale 0.7.
  const GemmShape mid{1000, 1000, 5000, 1, Dtype::fp8};
  EXPECT_NEAR(p.gemm_seconds(mid), mid.flops() / (2000e12 * 0.5 * 0.7), 1e-12);
  // Without the curve FP8 runs at the bf16 curve.
  const AnalyticProfile plain(topology_from_yaml_text(topology_text(""), "fp8-test"));
  EXPECT_NEAR(plain.gemm_seconds(big), big.flops() / (2000e12 * 0.5), 1e-12);
}

// A grouped FP8 GEMM (the local experts, GemmShape::grouped) runs at fp8_grouped_gemm_scale of one
// GEMM of a group's shape; single FP8 GEMMs, batched ones that are not grouped and bf16 ones are
// untouched.
TEST(Fp8Gemm, GroupedFp8GemmsTakeTheirOwnFraction) {
  const AnalyticProfile p(topology_from_yaml_text(
      topology_text("  fp8_gemm_scale_by_flops: [[1.0e9, 0.5], [1.0e11, 0.9]]\n  fp8_grouped_gemm_scale: 0.6\n"),
      "fp8-test"));
  const GemmShape one{4096, 4096, 4096, 1, Dtype::fp8};
  GemmShape grouped = one;
  grouped.batch = 8;
  grouped.grouped = true;
  EXPECT_NEAR(p.gemm_seconds(one), one.flops() / (2000e12 * 0.5 * 0.9), 1e-12);
  EXPECT_NEAR(p.gemm_seconds(grouped), 8.0 * one.flops() / (2000e12 * 0.5 * 0.9 * 0.6), 1e-12);
  GemmShape batched = grouped;
  batched.grouped = false;
  EXPECT_NEAR(p.gemm_seconds(batched), 8.0 * one.flops() / (2000e12 * 0.5 * 0.9), 1e-12);
  GemmShape bf16 = grouped;
  bf16.dtype = Dtype::bf16;
  EXPECT_NEAR(p.gemm_seconds(bf16), bf16.flops() / (1000e12 * 0.5), 1e-12);
}

// The error a topology text is refused with ("no error" when it is taken).
std::string error_of(const std::string& text) {
  try {
    topology_from_yaml_text(text, "fp8-test");
  } catch (const InputError& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

// On an MXFP8 device every FP8 GEMM, single or grouped, runs at mxfp8_gemm_scale of the
// per-tensor curve's rate; bf16 GEMMs are untouched. The key needs the mxfp8 recipe and the curve.
TEST(Fp8Gemm, Mxfp8GemmsTakeTheirFractionOfThePerTensorCurve) {
  const auto mxfp8 = [](std::string text) {
    const std::string at = "  memory_bandwidth_gbs: 3000\n";
    text.replace(text.find(at), at.size(), at + "  fp8_recipe: mxfp8\n");
    return text;
  };
  const std::string curve = "  fp8_gemm_scale_by_flops: [[1.0e9, 0.5], [1.0e11, 0.9]]\n  fp8_grouped_gemm_scale: 0.6\n";
  const AnalyticProfile p(topology_from_yaml_text(mxfp8(topology_text(curve + "  mxfp8_gemm_scale: 0.95\n")), "fp8-test"));
  const GemmShape one{4096, 4096, 4096, 1, Dtype::fp8};
  GemmShape grouped = one;
  grouped.batch = 8;
  grouped.grouped = true;
  EXPECT_NEAR(p.gemm_seconds(one), one.flops() / (2000e12 * 0.5 * 0.9 * 0.95), 1e-12);
  EXPECT_NEAR(p.gemm_seconds(grouped), 8.0 * one.flops() / (2000e12 * 0.5 * 0.9 * 0.6 * 0.95), 1e-12);
  GemmShape bf16 = one;
  bf16.dtype = Dtype::bf16;
  EXPECT_NEAR(p.gemm_seconds(bf16), bf16.flops() / (1000e12 * 0.5), 1e-12);
  EXPECT_NE(error_of(topology_text(curve + "  mxfp8_gemm_scale: 0.95\n")).find("fp8_recipe must be mxfp8"), std::string::npos);
  EXPECT_NE(error_of(mxfp8(topology_text("  mxfp8_gemm_scale: 0.95\n"))).find("give fp8_gemm_scale_by_flops too"),
            std::string::npos);
  EXPECT_NE(error_of(mxfp8(topology_text(curve + "  mxfp8_gemm_scale: 0\n"))).find("efficiency.mxfp8_gemm_scale"),
            std::string::npos);
}

TEST(Fp8Gemm, BadScalesNameTheKey) {
  EXPECT_NE(error_of(topology_text("  fp8_gemm_scale_by_flops: [[1.0e9, 1.5]]\n")).find("efficiency.fp8_gemm_scale_by_flops"),
            std::string::npos);
  EXPECT_NE(error_of(topology_text("  fp8_gemm_scale_by_flops: [[1.0e9, 0.8]]\n", "{fp32: 67, bf16: 1000}"))
                .find("has no fp8 peak"),
            std::string::npos);
  const std::string curve = "  fp8_gemm_scale_by_flops: [[1.0e9, 0.8]]\n";
  EXPECT_NE(error_of(topology_text(curve + "  fp8_grouped_gemm_scale: 1.2\n")).find("efficiency.fp8_grouped_gemm_scale"),
            std::string::npos);
  EXPECT_NE(error_of(topology_text("  fp8_grouped_gemm_scale: 0.5\n")).find("give fp8_gemm_scale_by_flops too"),
            std::string::npos);
}

// The ops named `name` in block b, in order (backward: data gradient, then weight gradient).
std::vector<const Op*> ops_named(const Block& b, const char* name) {
  std::vector<const Op*> out;
  for (int i = 0; i < b.count; ++i)
    if (std::strcmp(b.ops[i].name, name) == 0) out.push_back(&b.ops[i]);
  return out;
}

TEST(Fp8Quantize, BytesPerElementFollowTheRecipe) {
  const Fp8Quantize tensor = fp8_quantize_bytes(Fp8Recipe::tensor);
  EXPECT_DOUBLE_EQ(tensor.bytes(false), 6.0);  // amax pass 2 + cast-transpose 2 + 1 + 1
  EXPECT_DOUBLE_EQ(tensor.bytes(true), 4.0);   // the norm computed the amax
  EXPECT_EQ(tensor.scalar_launches, 2);        // zero the amax, compute the scale
  const Fp8Quantize mx = fp8_quantize_bytes(Fp8Recipe::mxfp8);
  EXPECT_DOUBLE_EQ(mx.bytes(false), 2.0 + 2.0 * (1.0 + 1.0 / 32));  // two FP8 copies, a scale per 32 each
  EXPECT_DOUBLE_EQ(mx.bytes(true), mx.bytes(false));
  EXPECT_EQ(mx.scalar_launches, 0);
}

// One tensor's kernels, hand-added: current scaling is an amax pass (2 B an element), a cast (4 B)
// and two scalar kernels, each at the memory curve's rate for its size plus a launch; a grouped
// GEMM's experts each pay that on their own rows.
TEST(Fp8Quantize, EachTensorIsItsOwnKernels) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "dgx-h100");
  const Profile& p = bench.profile;
  const auto k = [&](double bytes) { return p.kernel_seconds(KernelKind::elementwise, bytes, Dtype::bf16); };
  const Fp8Quantize q = fp8_quantize_bytes(Fp8Recipe::tensor);
  const double e = 1024.0 * 2048.0;
  const double one = k(2.0 * e) + k(4.0 * e) + 2.0 * p.kernel_seconds(KernelKind::elementwise, 4.0, Dtype::fp32);
  EXPECT_NEAR(fp8_quantize_seconds(p, q, e, 1, false), one, 1e-15);
  EXPECT_NEAR(fp8_quantize_seconds(p, q, e, 8, false), 8.0 * one, 1e-15);
  EXPECT_NEAR(fp8_quantize_seconds(p, q, e, 1, true), one - k(2.0 * e), 1e-15);
  // Eight experts of 1024 rows cost more than one tensor of their 8192 rows: launches and small kernels.
  EXPECT_GT(fp8_quantize_seconds(p, q, e, 8, false), fp8_quantize_seconds(p, q, 8.0 * e, 1, false));
  EXPECT_EQ(fp8_quantize_seconds(p, Fp8Quantize{}, e, 1, false), 0.0);
}

// Llama-3.1-70B on dgx-h100 (per-tensor current scaling) in FP8, t = 8: each linear's GEMM
// carries its input's quantization, hand-computed from its shape; the output gradient's rides on
// the data-gradient GEMM; the output layer stays unquantized.
TEST(Fp8Quantize, EveryLinearQuantizesItsInputForwardAndItsGradientBackward) {
  ModelSpec m = test::model("hf/llama-3.1-70b");
  m.dtype = Dtype::fp8;
  test::Bench bench(m, "dgx-h100");
  ParallelConfig c = test::config(8, 8, 1, 1, 8);
  c.pp = 1;
  const Workload w = bench.workload(c);
  const Profile& p = bench.profile;
  const Fp8Quantize q = fp8_quantize_bytes(Fp8Recipe::tensor);
  const Block& fwd = w.dense.forward;
  const Op* qkv = ops_named(fwd, "qkv_proj").at(0);
  const Op* proj = ops_named(fwd, "attn_out_proj").at(0);
  const GemmShape& gq = qkv->gemm;
  const GemmShape& gp = proj->gemm;
  // qkv's input is the RMSNorm's output (fused amax, 4 B); the projection's is the core's (6 B).
  EXPECT_DOUBLE_EQ(qkv->quantize_bytes, 4.0 * double(gq.m) * double(gq.k));
  EXPECT_DOUBLE_EQ(proj->quantize_bytes, 6.0 * double(gp.m) * double(gp.k));
  EXPECT_NEAR(qkv->seconds, p.gemm_seconds(gq) + fp8_quantize_seconds(p, q, double(gq.m) * double(gq.k), 1, true), 1e-15);
  EXPECT_NEAR(proj->seconds, p.gemm_seconds(gp) + fp8_quantize_seconds(p, q, double(gp.m) * double(gp.k), 1, false), 1e-15);
  EXPECT_DOUBLE_EQ(ops_named(fwd, "mlp_fc1").at(0)->quantize_bytes,
                   4.0 * double(ops_named(fwd, "mlp_fc1").at(0)->gemm.m) * double(ops_named(fwd, "mlp_fc1").at(0)->gemm.k));
  const Op* fc2 = ops_named(fwd, "mlp_fc2").at(0);
  EXPECT_DOUBLE_EQ(fc2->quantize_bytes, 6.0 * double(fc2->gemm.m) * double(fc2->gemm.k));
  // Backward: the data gradient quantizes the output gradient [m, n]; the weight gradient nothing.
  const auto bwd = ops_named(w.dense.backward, "attn_out_proj");
  ASSERT_EQ(bwd.size(), 2u);
  EXPECT_DOUBLE_EQ(bwd[0]->quantize_bytes, 6.0 * double(gp.m) * double(gp.n));
  EXPECT_NEAR(bwd[0]->seconds, p.gemm_seconds(bwd[0]->gemm) + fp8_quantize_seconds(p, q, double(gp.m) * double(gp.n), 1, false),
              1e-15);
  EXPECT_DOUBLE_EQ(bwd[1]->quantize_bytes, 0.0);
  EXPECT_NEAR(bwd[1]->seconds, p.gemm_seconds(bwd[1]->gemm), 1e-15);
  // The output layer does not run under FP8 in Megatron-Core (tensor_parallel.ColumnParallelLinear,
  // a torch matmul): neither quantized nor multiplied in FP8, forward and backward, at bf16's time.
  EXPECT_DOUBLE_EQ(ops_named(w.head_forward, "lm_head").at(0)->quantize_bytes, 0.0);
  for (const Block* block : {&w.head_forward, &w.head_backward})
    for (int i = 0; i < block->count; ++i) {
      const Op& op = block->ops[i];
      if (op.flops <= 0) continue;
      EXPECT_EQ(op.gemm.dtype, Dtype::bf16) << op.name;
      EXPECT_DOUBLE_EQ(op.seconds, p.gemm_seconds(op.gemm)) << op.name;
    }
  EXPECT_EQ(qkv->gemm.dtype, Dtype::fp8);
  // Nothing of the sort in bf16.
  ModelSpec b = m;
  b.dtype = Dtype::bf16;
  test::Bench bf16(b, "dgx-h100");
  const Workload wb = bf16.workload(c);
  for (int i = 0; i < wb.dense.forward.count; ++i) EXPECT_EQ(wb.dense.forward.ops[i].quantize_bytes, 0.0);
  for (int i = 0; i < wb.dense.backward.count; ++i) EXPECT_EQ(wb.dense.backward.ops[i].quantize_bytes, 0.0);
}

// Qwen3-30B-A3B on dgx-b200 (MXFP8): the grouped expert GEMMs quantize all their rows' inputs at
// 4.0625 B, and the router's gate stays unquantized.
TEST(Fp8Quantize, ExpertsQuantizeAtTheBlockScaledRateOnBlackwell) {
  ModelSpec m = test::model("qwen3-30b-a3b");
  m.dtype = Dtype::fp8;
  test::Bench bench(m, "dgx-b200");
  ParallelConfig c = test::config(8, 1, 8, 1, 8);
  const Workload w = bench.workload(c);
  const Op* fc1 = ops_named(w.moe.forward, "expert_fc1").at(0);
  const GemmShape& g = fc1->gemm;
  EXPECT_DOUBLE_EQ(fc1->quantize_bytes, 4.0625 * double(g.m) * double(g.k) * double(g.batch));
  EXPECT_GT(g.batch, 1);
  EXPECT_DOUBLE_EQ(ops_named(w.moe.forward, "gate").at(0)->quantize_bytes, 0.0);
  // The gate is a torch linear in Megatron-Core's router: a bf16 GEMM; the experts' are FP8.
  EXPECT_EQ(ops_named(w.moe.forward, "gate").at(0)->gemm.dtype, Dtype::bf16);
  EXPECT_EQ(g.dtype, Dtype::fp8);
}

TEST(Fp8Quantize, AnUnknownRecipeNamesTheKey) {
  try {
    topology_from_yaml_text(topology_text("").insert(std::string("name: fp8-test\ndevice:\n").size(), "  fp8_recipe: nvfp4\n"),
                            "fp8-test");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_recipe"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nvfp4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tedsim
