// Launch exports against the pinned upstream parsers' names (tests/data/, made from Megatron-LM,
// Megatron-DeepSpeed and DeepSpeed sources by scripts/upstream-names.py): every flag and config
// key emitted must exist upstream, and the plan's degrees must be the ones passed.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "test_helpers.hpp"
#include "tedsim/report/launch_export.hpp"

namespace tedsim {
namespace {

std::set<std::string> names(const std::string& file) {
  std::ifstream in(std::string(TEDSIM_SOURCE_DIR) + "/tests/data/" + file);
  std::set<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') out.insert(line);
  return out;
}

// The --flags of a bash array text, comments dropped.
std::vector<std::string> flags_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::size_t hash = line.find('#');
    std::istringstream words(line.substr(0, hash));
    std::string w;
    while (words >> w)
      if (w.rfind("--", 0) == 0) out.push_back(w);
  }
  return out;
}

// "section.key" for every key of a ds_config, and the sections themselves.
void config_keys(const nlohmann::json& j, const std::string& prefix, std::vector<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    out.push_back(prefix + it.key());
    if (it->is_object()) config_keys(*it, it.key() + ".", out);
  }
}

struct Plan {
  const char* model;
  int experts;  // -1: the model's
  int gpus, pp, vpp, tp, ep, micro_batch, batch, zero;
  bool sp, expert_tp;
  Recompute recompute;
};

Prediction plan_of(const test::Bench& bench, const Plan& k) {
  ParallelConfig c = test::config(k.gpus, k.tp, k.ep, k.micro_batch, k.batch);
  c.pp = k.pp;
  c.vpp = k.vpp;
  c.zero = k.zero;
  c.sequence_parallel = k.sp;
  c.expert_tp = k.expert_tp;
  c.recompute = k.recompute;
  c.dtd = k.tp > 1 && !k.sp;
  c.cac = k.recompute == Recompute::full && (k.tp > 1 || k.ep > 1);
  validate_config(c, bench.m);
  return bench.evaluator.evaluate(c);
}

TEST(LaunchExport, EveryNameExistsInThePinnedUpstreamParsers) {
  const std::set<std::string> megatron = names("megatron-lm-flags.txt");
  std::set<std::string> mds = names("megatron-deepspeed-flags.txt");
  const std::set<std::string> ds = names("deepspeed-config-keys.txt");
  for (const std::string& k : ds)
    if (k.rfind("--", 0) == 0) mds.insert(k);  // deepspeed.add_config_arguments' flags
  ASSERT_GT(megatron.size(), 500u);
  ASSERT_GT(mds.size(), 200u);
  ASSERT_EQ(megatron.count("--not-a-flag"), 0u);
  const Plan plans[] = {
      // dense with pipeline stages, interleaved, sequence parallelism, selective recompute
      {"ted-1.3b", 0, 32, 4, 2, 2, 1, 1, 256, 1, true, true, Recompute::selective},
      // MoE with expert tensor parallelism, full recompute (CAC), ZeRO-2
      {"ted-1.3b", -1, 64, 1, 1, 2, 8, 1, 256, 2, false, true, Recompute::full},
      // MoE without expert TP, pipeline, ZeRO-3, GQA and SwiGLU
      {"mixtral-8x7b", -1, 64, 2, 1, 2, 4, 1, 256, 3, false, false, Recompute::none}};
  for (const Plan& k : plans) {
    ModelSpec m = test::model(k.model);
    if (k.experts >= 0) m.set_experts(k.experts);
    test::Bench bench(m, "dgx-h100");
    const Prediction p = plan_of(bench, k);
    const std::string mlm = megatron_launch(bench.m, bench.topo, p);
    for (const std::string& f : flags_of(mlm)) EXPECT_EQ(megatron.count(f), 1u) << f << " in\n" << mlm;
    EXPECT_NE(mlm.find("--tensor-model-parallel-size " + std::to_string(k.tp) + "\n"), std::string::npos);
    EXPECT_NE(mlm.find("--pipeline-model-parallel-size " + std::to_string(k.pp) + "\n"), std::string::npos);
    EXPECT_NE(mlm.find("--global-batch-size " + std::to_string(k.batch) + "\n"), std::string::npos);
    if (bench.m.is_moe())
      EXPECT_NE(mlm.find("--expert-model-parallel-size " + std::to_string(k.ep) + "\n"), std::string::npos);
    const std::string args = megatron_deepspeed_launch(bench.m, bench.topo, p, "ds_config.json");
    for (const std::string& f : flags_of(args)) EXPECT_EQ(mds.count(f), 1u) << f << " in\n" << args;
    const nlohmann::json config = nlohmann::json::parse(deepspeed_config(bench.m, p));
    std::vector<std::string> keys;
    config_keys(config, "", keys);
    for (const std::string& key : keys) EXPECT_EQ(ds.count(key), 1u) << key;
    EXPECT_EQ(config["zero_optimization"]["stage"].get<int>(), k.zero);
    EXPECT_EQ(config["gradient_accumulation_steps"].get<int>(), p.config.grad_accum());
  }
}

// DeepSeek-V3 with its multi-token-prediction module, the flex dispatcher and per-layer CUDA graphs:
// the flags exist upstream and carry the plan's values.
TEST(LaunchExport, MtpAndCudaGraphScopesBecomeMegatronFlags) {
  const std::set<std::string> megatron = names("megatron-lm-flags.txt");
  test::Bench bench(test::model("deepseek-v3"), "gb200-nvl72");
  ParallelConfig c = test::config(256, 1, 64, 1, 256);
  c.pp = 4;
  c.recompute = Recompute::none;
  c.moe_dispatcher = MoeDispatcher::flex;
  c.cuda_graph_scopes = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
  validate_config(c, bench.m);
  const std::string mlm = megatron_launch(bench.m, bench.topo, bench.evaluator.evaluate(c));
  for (const std::string& f : flags_of(mlm)) EXPECT_EQ(megatron.count(f), 1u) << f << " in\n" << mlm;
  EXPECT_NE(mlm.find("--mtp-num-layers 1"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--cuda-graph-impl transformer_engine"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--cuda-graph-scope attn moe_router moe_preprocess"), std::string::npos) << mlm;
}

// Megatron-Bridge 26.06's Blackwell MoE recipe: a full-iteration graph over dropless MoE with
// HybridEP's capacity budget, and the fused grouped MLP. Every flag exists upstream.
TEST(LaunchExport, FullIterationGraphsAndTheFusedMlpBecomeMegatronFlags) {
  const std::set<std::string> megatron = names("megatron-lm-flags.txt");
  ModelSpec m = test::model("qwen3-30b-a3b");
  m.dtype = Dtype::fp8;
  test::Bench bench(m, "gb200-nvl72");
  ParallelConfig c = test::config(8, 1, 8, 4, 512);
  c.recompute = Recompute::none;
  c.cac = false;
  c.moe_dispatcher = MoeDispatcher::flex;
  c.cuda_graph_scopes = kGraphFullIteration;
  c.fused_grouped_mlp = true;
  validate_config(c, bench.m);
  const std::string mlm = megatron_launch(bench.m, bench.topo, bench.evaluator.evaluate(c));
  for (const std::string& f : flags_of(mlm)) EXPECT_EQ(megatron.count(f), 1u) << f << " in\n" << mlm;
  EXPECT_NE(mlm.find("--cuda-graph-impl full_iteration"), std::string::npos) << mlm;
  EXPECT_EQ(mlm.find("--cuda-graph-scope"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--moe-expert-rank-capacity-factor 1.5"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--use-transformer-engine-op-fuser"), std::string::npos) << mlm;
}

// The expert all-to-all overlap and the SMs tedsim priced for its kernels become Megatron-Core's flags.
TEST(LaunchExport, TheAllToAllOverlapBecomesMegatronFlags) {
  const std::set<std::string> megatron = names("megatron-lm-flags.txt");
  test::Bench bench(test::model("deepseek-v3"), "dgx-b200");
  ParallelConfig c = test::config(256, 1, 32, 1, 256);
  c.pp = 8;
  c.vpp = 2;
  c.pipeline_layout = "Etttt|(tttt|)*14tmL";
  c.recompute = Recompute::selective;
  c.recompute_modules = kRecomputeMlp;
  c.moe_dispatcher = MoeDispatcher::flex;
  c.moe_a2a_overlap = true;
  c.moe_a2a_overlap_sms = 24;
  validate_config(c, bench.m);
  const std::string mlm = megatron_launch(bench.m, bench.topo, bench.evaluator.evaluate(c));
  for (const std::string& f : flags_of(mlm)) EXPECT_EQ(megatron.count(f), 1u) << f << " in\n" << mlm;
  EXPECT_NE(mlm.find("--overlap-moe-expert-parallel-comm"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--moe-deepep-num-sms 24"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--num-virtual-stages-per-pipeline-rank 2"), std::string::npos) << mlm;
}

// Rotary models get RoPE with their base (Megatron-LM defaults to learned positions), partial
// rotation as a share, Qwen3's q/k norm; GPT-style models none of it. Every flag exists upstream.
TEST(LaunchExport, RopeAndQkNormBecomeMegatronFlags) {
  const std::set<std::string> megatron = names("megatron-lm-flags.txt");
  std::set<std::string> mds = names("megatron-deepspeed-flags.txt");
  for (const std::string& k : names("deepspeed-config-keys.txt"))
    if (k.rfind("--", 0) == 0) mds.insert(k);  // deepspeed.add_config_arguments' flags
  ModelSpec qwen = test::model("qwen3-30b-a3b");
  test::Bench bench(qwen, "dgx-h100");
  const Prediction p = plan_of(bench, {"qwen3-30b-a3b", -1, 16, 1, 1, 1, 16, 1, 1024, 1, false, true, Recompute::none});
  const std::string mlm = megatron_launch(bench.m, bench.topo, p);
  for (const std::string& f : flags_of(mlm)) EXPECT_EQ(megatron.count(f), 1u) << f << " in\n" << mlm;
  EXPECT_NE(mlm.find("--position-embedding-type rope\n"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--rotary-base 1000000\n"), std::string::npos) << mlm;
  EXPECT_NE(mlm.find("--qk-layernorm"), std::string::npos) << mlm;
  EXPECT_EQ(mlm.find("--rotary-percent"), std::string::npos) << mlm;  // the whole head
  const std::string args = megatron_deepspeed_launch(bench.m, bench.topo, p, "ds_config.json");
  for (const std::string& f : flags_of(args)) EXPECT_EQ(mds.count(f), 1u) << f << " in\n" << args;
  EXPECT_NE(args.find("--rotary-position-embeddings-theta 1000000\n"), std::string::npos) << args;
  ModelSpec half = qwen;
  half.rotary_dim = 64;  // half of head_dim 128
  test::Bench halved(half, "dgx-h100");
  EXPECT_NE(megatron_launch(halved.m, halved.topo, plan_of(halved, {"qwen3-30b-a3b", -1, 16, 1, 1, 1, 16, 1, 1024, 1, false, true,
                                                                      Recompute::none}))
                .find("--rotary-percent 0.5000\n"),
            std::string::npos);
  test::Bench gpt(test::model("ted-1.3b"), "dgx-h100");
  const std::string dense = megatron_launch(gpt.m, gpt.topo, plan_of(gpt, {"ted-1.3b", 0, 32, 4, 2, 2, 1, 1, 256, 1, true, true,
                                                                             Recompute::selective}));
  EXPECT_EQ(dense.find("--position-embedding-type"), std::string::npos) << dense;
  EXPECT_EQ(dense.find("--qk-layernorm"), std::string::npos) << dense;
}

TEST(LaunchExport, KnobsWithoutUpstreamFlagsAreCommentsNotFlags) {
  test::Bench bench(test::model("ted-1.3b"), "dgx-h100");
  const Plan k{"ted-1.3b", -1, 64, 1, 1, 2, 8, 1, 256, 1, false, true, Recompute::full};
  Prediction p = plan_of(bench, k);
  p.config.layout = RankLayout::data_before_expert;
  const std::string mlm = megatron_launch(bench.m, bench.topo, p);
  EXPECT_NE(mlm.find("#   communication-aware checkpointing (CAC)"), std::string::npos);
  EXPECT_NE(mlm.find("#   duplicate token dropping (DTD)"), std::string::npos);
  EXPECT_NE(mlm.find("#   the data-before-expert rank layout"), std::string::npos);
  for (const std::string& f : flags_of(mlm)) EXPECT_EQ(f.find("cac"), std::string::npos) << f;
}

}  // namespace
}  // namespace tedsim
