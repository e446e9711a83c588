// Today's MoE shapes: Hugging Face import against the published parameter counts, the YAML twins
// against their imports, layer patterns, and the cost model's new parts (shared experts, MLA,
// dropless load, grouped expert GEMMs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/layer_ops.hpp"
#include "tedsim/model/model_summary.hpp"
#include "tedsim/spec/hf_config.hpp"

namespace tedsim {
namespace {

// A published size like "3.3B" is a rounded figure: it says the count lies within half a unit of
// its last digit. tedsim's count must be within 1% of the figure, that rounding allowed for.
void expect_published(double ours, double published, double last_digit, const std::string& what) {
  const double allowed = 0.01 * published + 0.5 * last_digit;
  EXPECT_LE(std::abs(ours - published), allowed)
      << what << ": tedsim counts " << ours / 1e9 << " B, published " << published / 1e9 << " B";
}

struct Published {
  const char* model;
  double total, total_digit;    // parameters, and one unit of the published figure's last digit
  double active, active_digit;
  bool counts_input_embedding;  // the publisher's convention for active parameters
};

class PublishedSizes : public ::testing::TestWithParam<Published> {};

TEST_P(PublishedSizes, HuggingFaceImportMatchesThePublishedCounts) {
  const Published p = GetParam();
  const ModelSpec m = test::model(std::string("hf/") + p.model);
  expect_published(m.total_params(), p.total, p.total_digit, std::string(p.model) + " total");
  const double active = p.counts_input_embedding ? m.active_params() : m.active_params_without_input_embedding();
  expect_published(active, p.active, p.active_digit, std::string(p.model) + " active");
}

constexpr double B = 1e9;
INSTANTIATE_TEST_SUITE_P(
    Models, PublishedSizes,
    ::testing::Values(
        // DeepSeek-V3 report: 671B total, 37B activated; the 14B MTP module is not in either.
        Published{"deepseek-v3", 671 * B, 1 * B, 37 * B, 1 * B, false},
        Published{"qwen3-235b-a22b", 235 * B, 1 * B, 22 * B, 1 * B, true},
        Published{"qwen3-30b-a3b", 30.5 * B, 0.1 * B, 3.3 * B, 0.1 * B, true},
        Published{"mixtral-8x7b", 46.7 * B, 0.1 * B, 12.9 * B, 0.1 * B, true},
        Published{"mixtral-8x22b", 141 * B, 1 * B, 39 * B, 1 * B, true},
        Published{"olmoe-1b-7b", 6.9 * B, 0.1 * B, 1.3 * B, 0.1 * B, true},
        // OpenAI's model card: 116.83B total, 5.13B active without the embedding.
        Published{"gpt-oss-120b", 116.83 * B, 0.01 * B, 5.13 * B, 0.01 * B, false},
        Published{"qwen1.5-moe-a2.7b", 14.3 * B, 0.1 * B, 2.7 * B, 0.1 * B, true},
        Published{"deepseek-v2-lite", 15.7 * B, 0.1 * B, 2.4 * B, 0.1 * B, false}),
    [](const auto& info) {
      std::string name = info.param.model;
      for (char& c : name)
        if (c == '-' || c == '.') c = '_';
      return name;
    });

TEST(ModelImport, YamlTwinsResolveToTheSameModelAsTheirImports) {
  for (const char* name : {"deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x22b", "olmoe-1b-7b", "gpt-oss-120b"}) {
    const ModelSpec yaml = test::model(name);
    const ModelSpec hf = test::model(std::string("hf/") + name);
    EXPECT_EQ(yaml.total_params(), hf.total_params()) << name;
    EXPECT_EQ(yaml.active_params(), hf.active_params()) << name;
    EXPECT_EQ(yaml.moe_layers(), hf.moe_layers()) << name;
    EXPECT_EQ(yaml.layer_pattern(), hf.layer_pattern()) << name;
    EXPECT_EQ(yaml.moe.router, hf.moe.router) << name;
    EXPECT_EQ(yaml.moe.normalize_topk, hf.moe.normalize_topk) << name;
    EXPECT_EQ(yaml.moe.group_limited(), hf.moe.group_limited()) << name;
    EXPECT_EQ(yaml.head_dim(), hf.head_dim()) << name;
    EXPECT_EQ(yaml.rotary_dim, hf.rotary_dim) << name;
    EXPECT_EQ(yaml.rope_theta, hf.rope_theta) << name;
    EXPECT_EQ(yaml.yarn_factor, hf.yarn_factor) << name;
    EXPECT_DOUBLE_EQ(yaml.rope_attention_factor, hf.rope_attention_factor) << name;
    EXPECT_EQ(yaml.qk_norm, hf.qk_norm) << name;
  }
}

// Every imported architecture uses rotary position embeddings: on the whole head, or on MLA's
// rope part; GPT-2/3-style YAML models have learned positions (none), and the workload then has
// no rotary kernel.
TEST(ModelImport, RotaryEmbeddingsCoverTheHeadOrMlasRopePart) {
  EXPECT_EQ(test::model("hf/llama-3.1-70b").rotary_dim, 128);
  EXPECT_EQ(test::model("hf/qwen3-30b-a3b").rotary_dim, 128);
  EXPECT_EQ(test::model("hf/gpt-oss-120b").rotary_dim, 64);
  EXPECT_EQ(test::model("hf/deepseek-v3").rotary_dim, 64);  // qk_rope_head_dim, not the 192-wide head
  EXPECT_EQ(test::model("ted-6.7b").rotary_dim, 0);
}

// YaRN's attention factor, as transformers and Megatron-Core compute it: gpt-oss gives no mscale,
// so 0.1 ln 32 + 1; DeepSeek's mscale over mscale_all_dim is 1 (V3: 1/1, V2-Lite: 0.707/0.707).
// Only a factor other than 1 sends Megatron-Core to its unfused RoPE. Llama 3.1's own scaling
// only changes the frequencies: its key stays listed as ignored.
TEST(ModelImport, YarnsAttentionFactorDecidesWhetherRopeRunsFused) {
  const ModelSpec oss = test::model("hf/gpt-oss-120b");
  EXPECT_EQ(oss.yarn_factor, 32.0);
  EXPECT_NEAR(oss.rope_attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-12);
  EXPECT_TRUE(oss.rope_unfused());
  for (const char* name : {"hf/deepseek-v3", "hf/deepseek-v2-lite"}) {
    const ModelSpec ds = test::model(name);
    EXPECT_GT(ds.yarn_factor, 1.0) << name;
    EXPECT_NEAR(ds.rope_attention_factor, 1.0, 1e-12) << name;
    EXPECT_FALSE(ds.rope_unfused()) << name;
  }
  const ModelSpec llama = test::model("hf/llama-3.1-70b");
  EXPECT_EQ(llama.yarn_factor, 0.0);
  EXPECT_FALSE(llama.rope_unfused());
  EXPECT_NE(std::find(llama.ignored_keys.begin(), llama.ignored_keys.end(), "rope_scaling"), llama.ignored_keys.end());
  EXPECT_DOUBLE_EQ(yarn_attention_factor(1.0, 0, 0), 1.0);  // no scaling, no factor
  EXPECT_DOUBLE_EQ(yarn_attention_factor(40.0, 0.5, 1.0), (0.05 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1));
}

TEST(ModelImport, ReadsTheRoutingAndLayerPatternsEachArchitectureDeclares) {
  const ModelSpec ds = test::model("hf/deepseek-v3");
  EXPECT_EQ(ds.layer_pattern(), "3 dense, then 58 MoE");
  EXPECT_FALSE(ds.is_moe_layer(2));
  EXPECT_TRUE(ds.is_moe_layer(3));
  EXPECT_EQ(ds.moe.router, Router::sigmoid);
  EXPECT_TRUE(ds.moe.group_limited());
  EXPECT_EQ(ds.moe.topk_groups, 4);
  EXPECT_DOUBLE_EQ(ds.moe.routed_scaling, 2.5);
  EXPECT_TRUE(ds.is_mla());
  EXPECT_TRUE(ds.moe.dropless());
  EXPECT_EQ(ds.seq_len, kHfDefaultSeqLen);
  EXPECT_TRUE(ds.approximations.empty());
  EXPECT_EQ(ds.mtp_layers, 1);  // num_nextn_predict_layers
  // The MTP module beside the 671B: eh_proj 2h^2, three RMSNorms, an MoE layer (~11.6B; the
  // report's 14B also counts the module's copies of the shared embedding and output head).
  EXPECT_NEAR(ds.mtp_nonexpert_params() + ds.mtp_expert_params() + 2.0 * ds.vocab * ds.hidden, 14e9, 0.6e9);

  const ModelSpec mixtral = test::model("hf/mixtral-8x7b");
  EXPECT_EQ(mixtral.moe.router, Router::topk_softmax);
  EXPECT_EQ(mixtral.layer_pattern(), "32 MoE");
  const ModelSpec qwen2 = test::model("hf/qwen1.5-moe-a2.7b");
  EXPECT_EQ(qwen2.moe.shared_experts, 1);
  EXPECT_TRUE(qwen2.moe.shared_gate);
  EXPECT_TRUE(qwen2.qkv_bias);
  const ModelSpec qwen3 = test::model("hf/qwen3-30b-a3b");
  EXPECT_EQ(qwen3.head_dim(), 128);  // not hidden / heads = 64
  EXPECT_EQ(qwen3.q_dim(), 4096);
  // gpt-oss: layer_types alternates sliding and full attention, starting with sliding.
  const ModelSpec oss = test::model("hf/gpt-oss-120b");
  EXPECT_TRUE(oss.approximations.empty());
  EXPECT_EQ(oss.sliding_window, 128);
  EXPECT_EQ(oss.full_attention_every, 2);
  EXPECT_TRUE(oss.is_window_layer(0));
  EXPECT_FALSE(oss.is_window_layer(1));
  EXPECT_TRUE(oss.is_window_layer(34));
  EXPECT_FALSE(oss.is_window_layer(35));
  const ModelSpec shipped = test::model("gpt-oss-120b");  // the YAML says the same
  EXPECT_EQ(shipped.sliding_window, 128);
  EXPECT_EQ(shipped.full_attention_every, 2);
  const ModelSpec llama = test::model("hf/llama-3.1-8b");
  EXPECT_FALSE(llama.is_moe());
  EXPECT_NEAR(llama.total_params() / 1e9, 8.03, 0.005);
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ModelImport, QwenSparseStepAndDenseOnlyLayersFollowHuggingFace) {
  // Layer i is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers.
  const std::string path = write_temp("sparse_step.json", R"({
    "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4, "vocab_size": 1000,
    "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [3],
    "shared_expert_intermediate_size": 0})");
  const ModelSpec m = load_model(path);
  std::string kinds;
  for (int i = 0; i < m.layers; ++i) kinds += m.is_moe_layer(i) ? 'M' : 'D';
  EXPECT_EQ(kinds, "DMDDDMDM");
  EXPECT_EQ(m.moe_layers(), 3);
  EXPECT_EQ(m.moe.shared_experts, 0);
}

TEST(ModelImport, EveryUnreadKeyIsEitherIgnoredByNameOrAnError) {
  const std::string ok = write_temp("ok.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
    "rope_theta": 500000.0, "rope_scaling": null, "bos_token_id": 1})");
  const HfImport imported = import_hf_config(ok);
  EXPECT_EQ(imported.ignored, (std::vector<std::string>{"bos_token_id", "rope_scaling"}));
  EXPECT_EQ(imported.model.rope_theta, 500000.0);  // read: validate's step rotates with it
  const std::string bad = write_temp("bad.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
    "num_experts": 8})");
  try {
    import_hf_config(bad);
    FAIL() << "an unknown shape key must be an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'num_experts': not understood for LlamaForCausalLM"), std::string::npos) << e.what();
  }
}

TEST(ModelImport, RopeBaseFromEitherKeyOrTheDefault) {
  const std::string shape = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000)";
  // transformers 5 nests the base in rope_parameters.
  const std::string nested = write_temp("nested.json", "{" + shape + R"(, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})");
  EXPECT_EQ(import_hf_config(nested).model.rope_theta, 1e6);
  const std::string none = write_temp("none.json", "{" + shape + "}");
  EXPECT_EQ(import_hf_config(none).model.rope_theta, kDefaultRopeTheta);
  EXPECT_EQ(import_hf_config(none).model.rotary_dim, 64);  // the whole head: 256 / 4
}

TEST(ModelSummary, ForwardFlopsAreTwiceTheActiveWeightsPlusTheAttentionCore) {
  const ModelSpec m = test::model("qwen3-30b-a3b");
  const ModelSummary s = summarize_model(m, 4096);
  ASSERT_EQ(s.kinds.size(), 1u);
  const double core = 2.0 * 4096 * m.heads * 2.0 * m.head_dim();
  EXPECT_DOUBLE_EQ(s.kinds[0].forward_flops_per_token, 2.0 * s.kinds[0].active_params + core);
  EXPECT_DOUBLE_EQ(s.active_params, s.kinds[0].count * s.kinds[0].active_params + s.embedding_params + m.norm_params());
}

double op_flops(const Block& b, const char* prefix) {
  double f = 0;
  for (int i = 0; i < b.count; ++i)
    if (std::strncmp(b.ops[i].name, prefix, std::strlen(prefix)) == 0) f += b.ops[i].flops;
  return f;
}

TEST(TodaysMoeCost, ExpertGemmsCoverTheActiveExpertsOfEveryToken) {
  // Dropless, balanced (imbalance 1), one rank: the grouped GEMMs do exactly k experts' work per
  // token: 2 x tokens x k x expert weights.
  ModelSpec m = test::model("qwen3-30b-a3b");
  m.moe.imbalance = 1.0;
  test::Bench bench(m, "dgx-h100");
  ParallelConfig c = test::config(1, 1, 1, 1, 1);
  const Workload w = bench.workload(c);
  const double tokens = 4096;
  EXPECT_NEAR(op_flops(w.moe.forward, "expert_fc") / (2.0 * tokens * m.moe.top_k * m.mlp_params(m.expert_ffn())), 1.0, 1e-3);
  EXPECT_DOUBLE_EQ(w.shape.load_factor, 1.0);
  // One rank holds every expert, so however skewed the experts, it computes all k T rows.
  m.moe.imbalance = 3.0;
  test::Bench skewed(m, "dgx-h100");
  EXPECT_DOUBLE_EQ(skewed.workload(c).shape.load_factor, 1.0);
}

TEST(TodaysMoeCost, DroplessLoadIsTheBusiestRanksAndModelFlopsStayTheMean) {
  ModelSpec m = test::model("qwen3-30b-a3b");
  m.moe.imbalance = 1.0;
  test::Bench balanced(m, "dgx-h100");
  m.moe.imbalance = 2.0;
  test::Bench skewed(m, "dgx-h100");
  ParallelConfig c = test::config(64, 1, 64, 1, 64);  // two local experts per rank
  const Workload wb = balanced.workload(c), ws = skewed.workload(c);
  // The busiest rank holds the busiest expert (2x) and one of the other 127, which share the
  // remaining 126 experts' worth of tokens: (2 + 126/127) / 2 of the mean load.
  const double busiest = (2.0 + 126.0 / 127.0) / 2.0;
  EXPECT_DOUBLE_EQ(ws.shape.load_factor, busiest);
  EXPECT_NEAR(op_flops(ws.moe.forward, "expert_fc") / op_flops(wb.moe.forward, "expert_fc"), busiest, 0.01);
  EXPECT_NEAR(imbalance_for_rank_load(128, 64, busiest), 2.0, 1e-12);  // and back
  EXPECT_GT(test::op_seconds(ws.moe.forward, "ep_alltoall_dispatch"), test::op_seconds(wb.moe.forward, "ep_alltoall_dispatch"));
  EXPECT_NEAR(ws.model_flops_per_microbatch / wb.model_flops_per_microbatch, 1.0, 0.002);
}

TEST(TodaysMoeCost, DroplessExchangesAreAllToAllVAndCapacityOnesEven) {
  ModelSpec m = test::model("qwen3-30b-a3b");  // dropless
  test::Bench dropless(m, "dgx-h100");
  ParallelConfig c = test::config(64, 1, 64, 1, 64);
  const Workload w = dropless.workload(c);
  // Dispatch and combine, forward and backward: MPI_Alltoallv / NCCL grouped send-recv.
  EXPECT_EQ(w.moe.forward.count_collectives(CollectiveOp::all_to_all_v, GroupKind::expert), 2);
  EXPECT_EQ(w.moe.backward.count_collectives(CollectiveOp::all_to_all_v, GroupKind::expert), 2);
  EXPECT_EQ(w.moe.forward.count_collectives(CollectiveOp::all_to_all, GroupKind::expert), 0);
  // The analytic profile prices it as the even exchange of the busiest rank's size.
  const GroupSpan experts = dropless.evaluator.spans_for(c).of(GroupKind::expert).widest();
  const double bytes = w.moe.forward.collective_bytes(CollectiveOp::all_to_all_v, GroupKind::expert) / 2;
  EXPECT_DOUBLE_EQ(dropless.profile.collective_seconds(CollectiveOp::all_to_all_v, experts, bytes),
                   dropless.profile.collective_seconds(CollectiveOp::all_to_all, experts, bytes));
  m.moe.capacity_factor = 1.25;
  test::Bench capacity(m, "dgx-h100");
  const Workload wc = capacity.workload(c);
  EXPECT_EQ(wc.moe.forward.count_collectives(CollectiveOp::all_to_all, GroupKind::expert), 2);
  EXPECT_EQ(wc.moe.forward.count_collectives(CollectiveOp::all_to_all_v, GroupKind::expert), 0);
}

TEST(TodaysMoeCost, SharedExpertsRunBesideTheRoutedOnesAndOverlapHidesTheAllToAll) {
  const ModelSpec m = test::model("deepseek-v3");
  test::Bench bench(m, "h200");
  ParallelConfig c = test::config(64, 1, 64, 1, 64);
  c.pp = 1;
  c.zero = 1;
  const Workload plain = bench.workload(c);
  const double tokens = 4096;
  EXPECT_NEAR(op_flops(plain.moe.forward, "shared_fc") / (2.0 * tokens * m.shared_expert_params()), 1.0, 1e-9);
  c.shared_expert_overlap = true;
  const Workload overlapped = bench.workload(c);
  const double a2a_plain = test::op_seconds(plain.moe.forward, "ep_alltoall_dispatch") + test::op_seconds(plain.moe.forward, "ep_alltoall_combine");
  const double a2a_overlapped =
      test::op_seconds(overlapped.moe.forward, "ep_alltoall_dispatch") + test::op_seconds(overlapped.moe.forward, "ep_alltoall_combine");
  const double shared = test::op_seconds(plain.moe.forward, "shared_fc1") + test::op_seconds(plain.moe.forward, "shared_activation") +
                        test::op_seconds(plain.moe.forward, "shared_fc2");
  EXPECT_NEAR(a2a_plain - a2a_overlapped, std::min(shared, a2a_plain), 1e-12);
  EXPECT_NEAR(plain.moe.forward.seconds - overlapped.moe.forward.seconds, std::min(shared, a2a_plain), 1e-12);
}

TEST(TodaysMoeCost, MlaProjectionsMatchItsParameterCount) {
  // On one rank, MLA's GEMMs are its weights times 2 x tokens, plus the attention core.
  const ModelSpec m = test::model("deepseek-v3");
  test::Bench bench(m, "h200");
  const Workload w = bench.workload(test::config(1, 1, 1, 1, 1));
  const double tokens = 4096;
  const double projections = op_flops(w.dense.forward, "mla_") + op_flops(w.dense.forward, "attn_out_proj");
  const double weights = m.attention_params() - m.mla.q_lora_rank - m.mla.kv_lora_rank;  // the latent norms' gains
  EXPECT_NEAR(projections / (2.0 * tokens * weights), 1.0, 1e-9);
  // One measured kernel where the topology has attention rates (h200 does), else its two GEMMs.
  const double core = op_flops(w.dense.forward, "attn_core") + op_flops(w.dense.forward, "attn_scores") +
                      op_flops(w.dense.forward, "attn_context");
  EXPECT_NEAR(core / (2.0 * tokens * 4096 * m.heads * (m.mla.qk_head_dim() + m.mla.v_head_dim)), 1.0, 1e-9);
}

TEST(TodaysMoeCost, TensorParallelismMustDivideTheExpertAndSharedWidths) {
  ModelSpec m = test::model("qwen3-30b-a3b");
  ParallelConfig c = test::config(8, 4, 1, 1, 8);
  EXPECT_TRUE(config_is_valid(c, m));
  m.moe.ffn = 766;  // not divisible by 4
  EXPECT_NE(config_violation(c, m).find("expert width 766"), std::string::npos);
  c.expert_tp = false;
  EXPECT_TRUE(config_is_valid(c, m));
}

double op_bytes(const Block& b, const char* name) {
  for (int i = 0; i < b.count; ++i)
    if (std::strcmp(b.ops[i].name, name) == 0) return b.ops[i].bytes;
  return 0;
}

TEST(TodaysMoeCost, Fp8RunsGemmsAtTheFp8PeakAndKeepsBf16EverywhereElse) {
  ModelSpec m = test::model("qwen3-30b-a3b");
  test::Bench bf16(m, "dgx-h100");
  m.dtype = Dtype::fp8;
  test::Bench fp8(m, "dgx-h100");
  ParallelConfig c = test::config(16, 1, 16, 1, 16);
  const Workload wb = bf16.workload(c), wf = fp8.workload(c);
  // Same FLOPs, at twice the peak and the topology's FP8 efficiency ratio (dgx-h100: 0.883 of
  // the bf16 curve's, at every size), plus the quantization of the GEMM's input (per-tensor
  // current scaling: 6 bytes per element of the [rows, h] input of every local expert).
  EXPECT_DOUBLE_EQ(op_flops(wf.moe.forward, "expert_fc1"), op_flops(wb.moe.forward, "expert_fc1"));
  double quantize_bytes = 0;
  for (int i = 0; i < wf.moe.forward.count; ++i)
    if (std::string(wf.moe.forward.ops[i].name) == "expert_fc1") {
      const GemmShape& g = wf.moe.forward.ops[i].gemm;
      quantize_bytes = wf.moe.forward.ops[i].quantize_bytes;
      EXPECT_DOUBLE_EQ(quantize_bytes, 6.0 * double(g.m) * double(g.k) * double(g.batch));
    }
  double fc1_elements = 0, fc1_experts = 0;
  for (int i = 0; i < wf.moe.forward.count; ++i)
    if (std::string(wf.moe.forward.ops[i].name) == "expert_fc1") {
      fc1_elements = double(wf.moe.forward.ops[i].gemm.m) * double(wf.moe.forward.ops[i].gemm.k);
      fc1_experts = double(wf.moe.forward.ops[i].gemm.batch);
    }
  const double quantize_s =
      fp8_quantize_seconds(fp8.profile, fp8_quantize_bytes(Fp8Recipe::tensor), fc1_elements, fc1_experts, false);
  EXPECT_NEAR((test::op_seconds(wf.moe.forward, "expert_fc1") - quantize_s) / test::op_seconds(wb.moe.forward, "expert_fc1"),
              0.5 / 0.883, 0.01);
  // Activations, gradients and weights stay bf16; the memory-bound kernels do not speed up.
  EXPECT_EQ(wf.shape.act_bytes, 2);
  EXPECT_EQ(wf.grad_bytes, 2);
  EXPECT_DOUBLE_EQ(test::op_seconds(wf.moe.forward, "expert_activation"), test::op_seconds(wb.moe.forward, "expert_activation"));
  // Dispatch and combine both move bf16 tokens (Megatron-Core's dispatchers have no FP8 path).
  EXPECT_DOUBLE_EQ(op_bytes(wf.moe.forward, "ep_alltoall_dispatch"), op_bytes(wb.moe.forward, "ep_alltoall_dispatch"));
  EXPECT_DOUBLE_EQ(op_bytes(wf.moe.forward, "ep_alltoall_combine"), op_bytes(wb.moe.forward, "ep_alltoall_combine"));
  const Prediction pb = bf16.evaluator.evaluate(c), pf = fp8.evaluator.evaluate(c);
  EXPECT_DOUBLE_EQ(pf.memory.weights, pb.memory.weights);
  // Activations: FP8 linears keep their inputs as 1-byte FP8 copies (dgx-h100: per-tensor scaling),
  // so per layer the qkv input [T, h] and the experts' fc1 and fc2 inputs lose a byte an element,
  // while the output projection keeps an FP8 copy of the core's output beside the core's bf16 one.
  const StepShape& s = wf.shape;
  const double T = double(s.tokens), rows = double(s.expert_rows) * s.local_experts;
  const double out_width = double(m.heads) / s.t * m.head_dim();
  const double per_layer = T * m.hidden + rows * m.hidden + rows * s.ffn_local - T * out_width;
  // Under full recompute (this configuration's) only the layer being recomputed holds them.
  ASSERT_EQ(c.recompute, Recompute::full);
  EXPECT_NEAR(pb.memory.activations - pf.memory.activations, per_layer, 1e-9 * pb.memory.activations);
  // The whole iteration is not asserted faster: at one sequence per micro-batch over 8 local
  // experts, the per-expert quantization costs about what the FP8 GEMMs save (within 1% here).
}

}  // namespace
}  // namespace tedsim
