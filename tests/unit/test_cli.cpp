// The tedsim binary as a user runs it: JSON shapes, stdout carrying JSON alone, traces, CSV.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tedsim/report/text_table.hpp"
#include "tedsim/spec/data_files.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace {

struct CommandRun {
  int code;
  std::string out;
};

CommandRun run_tedsim(const std::string& args) {
  const std::string command = std::string(TEDSIM_BINARY) + " " + args + " 2>/dev/null";
  CommandRun r{0, {}};
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, {}};
  std::array<char, 4096> buffer;
  std::size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "tedsim_" + name; }

TEST(Cli, SimulateJsonOnStdoutHasEveryDocumentedKey) {
  const CommandRun r = run_tedsim("simulate --model ted-1.3b --topology thetagpu --gpus 32 --tp 2 --ep 8 --global-batch 256 --json -");
  ASSERT_EQ(r.code, 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);  // stdout carries the JSON alone
  for (const char* key : {"iteration_time_s", "tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu", "fits",
                          "memory", "breakdown_s", "busy_s", "config"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_TRUE(j["memory"].contains("peak_gib"));
  double sum = 0;
  for (const char* key : {"compute", "tp_allreduce", "tp_allgather", "ep_alltoall", "dp_grad_sync", "optimizer", "other"}) {
    ASSERT_TRUE(j["breakdown_s"].contains(key)) << key;
    ASSERT_TRUE(j["busy_s"].contains(key)) << key;
    sum += j["breakdown_s"][key].get<double>();
  }
  EXPECT_NEAR(sum, j["iteration_time_s"].get<double>(), 1e-9 * sum);
  for (const char* key : {"gpus", "tp", "ep", "dp", "dp_expert", "micro_batch", "grad_accum", "dtd", "cac", "checkpoint",
                          "zero", "expert_tp", "layout"})
    EXPECT_TRUE(j["config"].contains(key)) << key;
  EXPECT_EQ(j["config"]["tp"], 2);
  EXPECT_EQ(j["config"]["dp"], 16);
  EXPECT_EQ(j["config"]["dp_expert"], 2);
  EXPECT_EQ(j["config"]["grad_accum"], 16);
}

TEST(Cli, SearchJsonListsResultsBestFirstAndWritesCsv) {
  const std::string csv = temp_path("search.csv");
  const CommandRun r = run_tedsim("search --model tiny-moe --topology local-cpu --gpus 8 --global-batch 32 --top 5 --json - --csv " + csv);
  ASSERT_EQ(r.code, 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["evaluated"].get<long long>(), 0);
  EXPECT_GT(j["feasible"].get<long long>(), 0);
  ASSERT_EQ(j["results"].size(), 5u);
  for (std::size_t i = 1; i < j["results"].size(); ++i)
    EXPECT_GE(j["results"][i - 1]["tokens_per_s"].get<double>(), j["results"][i]["tokens_per_s"].get<double>());
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("rank,p,v,t,c,e,d", 0), 0u) << header;
}

TEST(Cli, DefaultSearchRunsBare) {
  const CommandRun r = run_tedsim("search");
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("ted-6.7b"), std::string::npos);
  EXPECT_NE(r.out.find("128 devices"), std::string::npos);
  EXPECT_NE(r.out.find("evaluations/s"), std::string::npos);
}

TEST(Cli, TraceIsAChromeTraceWithBothStreams) {
  const std::string trace = temp_path("trace.json");
  const CommandRun r = run_tedsim("simulate --model tiny-moe --topology local-cpu --gpus 4 --tp 2 --ep 2 --global-batch 16 --zero 0 --trace " + trace);
  ASSERT_EQ(r.code, 0);
  std::ifstream in(trace);
  const nlohmann::json j = nlohmann::json::parse(in);
  bool compute = false, dp = false;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    compute |= e["tid"] == 0;
    dp |= e["tid"] == 1;
  }
  EXPECT_TRUE(compute);
  EXPECT_TRUE(dp);
}


// --ops lists each block the model runs, once per distinct layer kind, with how many layers run it
// and every op the block's time is made of; the expert GEMMs carry the local experts as a batch.
TEST(Cli, SimulateOpsListsEveryOpOfEachLayerKind) {
  auto ops_of = [](int ep) {
    const CommandRun r = run_tedsim(
        "simulate --model gpt-oss-120b --topology dgx-h100 --gpus 64 --global-batch 1280 --tp 1 --pp 4 --ep " +
        std::to_string(ep) + " --micro-batch 1 --zero 1 --dtype bf16 --imbalance 1.0 --attention-kernel flash --ops --json -");
    EXPECT_EQ(r.code, 0);
    return nlohmann::json::parse(r.out)["ops"];
  };
  const nlohmann::json ops = ops_of(8);
  std::map<std::string, int> layers;
  for (const auto& block : ops) {
    layers[block["block"].get<std::string>()] = block["count"].get<int>();
    for (const auto& [pass, content] : block["passes"].items()) {
      double sum = 0;
      for (const auto& op : content["ops"]) sum += op["seconds"].get<double>();
      EXPECT_NEAR(sum, content["seconds"].get<double>(), 1e-9 * sum) << block["block"] << " " << pass;
    }
  }
  // gpt-oss: 36 MoE layers, every other one with a 128-token window; an embedding and a head.
  EXPECT_EQ(layers["MoE layer"], 18);
  EXPECT_EQ(layers["MoE layer, windowed"], 18);
  EXPECT_EQ(layers.count("dense layer"), 0u);
  EXPECT_EQ(layers["head and loss"], 1);
  auto expert_fc1 = [](const nlohmann::json& blocks) {
    for (const auto& block : blocks)
      if (block["block"] == "MoE layer")
        for (const auto& op : block["passes"]["forward"]["ops"])
          if (op["name"] == "expert_fc1") return op;
    return nlohmann::json();
  };
  const nlohmann::json fc1 = expert_fc1(ops);
  ASSERT_FALSE(fc1.is_null());
  EXPECT_EQ(fc1["kind"], "gemm");
  // 128 experts over 8 ranks, balanced: 16 local ones, each of 4096 tokens x top-4 x 8 ranks / 128 rows.
  EXPECT_EQ(fc1["shape"]["batch"], 16);
  EXPECT_EQ(fc1["shape"]["m"], 1024);
  EXPECT_EQ(fc1["shape"]["n"], 2 * 2880);  // SwiGLU's gate and up halves
  EXPECT_DOUBLE_EQ(fc1["flops"].get<double>(), 2.0 * 16 * 1024 * 5760 * 2880);
  EXPECT_EQ(expert_fc1(ops_of(16))["shape"]["batch"], 8);
  // Host calls: GroupedLinear's one per local expert and one for the module (bf16: no quantizer);
  // the alltoall dispatcher's preprocessing syncs, and carries the host's code after the sync.
  EXPECT_DOUBLE_EQ(fc1["host_calls"].get<double>(), 16.0 + 1.0);
  bool synced = false;
  for (const auto& block : ops)
    for (const auto& op : block["passes"]["forward"]["ops"])
      if (op["name"] == "moe_preprocess") {
        synced = op.value("host_sync", false);
        EXPECT_GT(op["host_calls"].get<double>(), 45.0);
      }
  EXPECT_TRUE(synced);
}
TEST(Cli, HelpWorksEverywhere) {
  const CommandRun top = run_tedsim("--help");
  EXPECT_EQ(top.code, 0);
  EXPECT_NE(top.out.find("simulate"), std::string::npos);
  EXPECT_NE(top.out.find("search"), std::string::npos);
  for (const char* args : {"simulate --help", "search --help", "scale --help"}) {
    const CommandRun r = run_tedsim(args);
    EXPECT_EQ(r.code, 0) << args;
    EXPECT_NE(r.out.find("--model"), std::string::npos) << args;
    EXPECT_NE(r.out.find("--html"), std::string::npos) << args;
  }
  const CommandRun report = run_tedsim("report --help");
  EXPECT_EQ(report.code, 0);
  EXPECT_NE(report.out.find("--html TEXT REQUIRED"), std::string::npos) << report.out;
}

}  // namespace

namespace {

// The default a --help line states for `flag`: "--tp INT=2" gives "2"; "--dtd ... (default: on" gives "on".
std::string help_default(const std::string& help, const std::string& flag) {
  std::size_t at = 0;
  while ((at = help.find("  " + flag, at)) != std::string::npos) {
    const std::size_t after = at + 2 + flag.size();
    if (after < help.size() && (help[after] == ' ' || help[after] == '\n')) break;
    at = after;
  }
  if (at == std::string::npos) return "";
  const std::size_t end = help.find("\n  -", at + 1);
  const std::string entry = help.substr(at, end == std::string::npos ? std::string::npos : end - at);
  const std::size_t eq = entry.find('=');
  const std::size_t def = entry.find("(default: ");
  if (def != std::string::npos && (eq == std::string::npos || def < eq)) {
    const std::size_t from = def + 10;
    return entry.substr(from, entry.find_first_of(";)", from) - from);
  }
  if (eq == std::string::npos) return "";
  const std::size_t stop = entry.find_first_of(" \n", eq);
  return entry.substr(eq + 1, stop - eq - 1);
}

std::string json_text(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "on" : "off";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

}  // namespace

TEST(Cli, SimulateHelpStatesTheDefaultsItRuns) {
  const CommandRun help = run_tedsim("simulate --help");
  ASSERT_EQ(help.code, 0);
  const CommandRun bare = run_tedsim("simulate --json -");
  ASSERT_EQ(bare.code, 0);
  const nlohmann::json j = nlohmann::json::parse(bare.out);
  const nlohmann::json& c = j["config"];
  const std::pair<const char*, const char*> flags[] = {
      {"--gpus", "gpus"}, {"--global-batch", "global_batch"}, {"--pp", "pp"}, {"--vpp", "vpp"}, {"--tp", "tp"},
      {"--ep", "ep"}, {"--micro-batch", "micro_batch"}, {"--zero", "zero"}, {"--dtd", "dtd"}, {"--cac", "cac"},
      {"--checkpoint", "checkpoint"}, {"--sequence-parallel", "sequence_parallel"}, {"--expert-tp", "expert_tp"},
      {"--tiled-optimizer", "tiled_optimizer"}, {"--layout", "layout"}};
  for (const auto& [flag, key] : flags) {
    ASSERT_TRUE(c.contains(key)) << key;
    EXPECT_EQ(help_default(help.out, flag), json_text(c[key])) << flag;
  }
  EXPECT_EQ(help_default(help.out, "--model"), j["model"].get<std::string>());
  EXPECT_EQ(help_default(help.out, "--topology"), j["topology"].get<std::string>());
}

TEST(Cli, SearchAndValidateHelpStateTheirDefaults) {
  const CommandRun help = run_tedsim("search --help");
  ASSERT_EQ(help.code, 0);
  const CommandRun bare = run_tedsim("search --json -");
  ASSERT_EQ(bare.code, 0);
  const nlohmann::json j = nlohmann::json::parse(bare.out);
  EXPECT_EQ(help_default(help.out, "--top"), std::to_string(j["results"].size()));
  EXPECT_EQ(help_default(help.out, "--gpus"), j["results"][0]["config"]["gpus"].dump());
  EXPECT_EQ(help_default(help.out, "--global-batch"), j["results"][0]["config"]["global_batch"].dump());
  EXPECT_EQ(help_default(help.out, "--model"), j["model"].get<std::string>());
  // validate takes its device count from mpirun, and says so.
  const CommandRun v = run_tedsim("validate --help");
  ASSERT_EQ(v.code, 0);
  EXPECT_EQ(help_default(v.out, "--gpus"), "the");  // "--gpus INT=the MPI world size"
  EXPECT_NE(v.out.find("--gpus INT=the MPI world size"), std::string::npos);
  EXPECT_EQ(help_default(v.out, "--dtd"), "on");
  EXPECT_EQ(v.out.find("{false}"), std::string::npos);
}

TEST(Cli, ScaleHelpStatesItsDefaults) {
  const CommandRun help = run_tedsim("scale --help");
  ASSERT_EQ(help.code, 0);
  const CommandRun bare = run_tedsim("scale --model tiny-moe --topology local-cpu --threads 1 --json -");
  ASSERT_EQ(bare.code, 0) << bare.out;
  const nlohmann::json j = nlohmann::json::parse(bare.out);
  std::vector<int> sizes;
  for (const auto& s : j["sizes"]) sizes.push_back(s["gpus"].get<int>());
  std::string listed = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) listed += (i ? "," : "") + std::to_string(sizes[i]);
  EXPECT_EQ(help_default(help.out, "--gpus"), listed + "]");
  EXPECT_EQ(help_default(help.out, "--global-batch"), j["global_batch"].dump());
  for (const auto& s : j["sizes"]) {
    ASSERT_FALSE(s["best"].is_null()) << s.dump();
    EXPECT_EQ(s["best"]["config"]["gpus"], s["gpus"]);
    EXPECT_GT(s["best"]["tokens_per_s"].get<double>(), 0);
  }
}

TEST(Cli, SearchThreadsGiveTheSameRanking) {
  const std::string args = "search --model tiny-moe --topology local-cpu --gpus 8 --global-batch 32 --top 20 --json - --threads ";
  const CommandRun one = run_tedsim(args + "1"), two = run_tedsim(args + "2");
  ASSERT_EQ(one.code, 0);
  ASSERT_EQ(two.code, 0);
  nlohmann::json a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(two.out);
  a.erase("seconds");
  b.erase("seconds");
  EXPECT_EQ(a.dump(), b.dump());  // byte-identical but for the time it took
}

namespace tedsim {
namespace {

// An analytic prediction on a machine with published measurements carries their error as a range:
// printed, and in the JSON, (1 + min) to (1 + max) times the predicted iteration.
TEST(Cli, AnalyticPredictionsCarryTheirMachinesPublishedError) {
  const TopologySpec selene = load_topology(resolve_data_file("topologies", "selene"));
  ASSERT_GT(selene.published.rows, 0);
  const std::string args = "simulate --model published/megatron-gpt-1.7b --topology selene --gpus 32 --tp 1 --ep 1 --pp 1 "
                           "--global-batch 512 --zero 0 --recompute full";
  const CommandRun text = run_tedsim(args);
  ASSERT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("published error: on " + std::to_string(selene.published.rows) + " published measurements of selene"),
            std::string::npos) << text.out;
  const CommandRun r = run_tedsim(args + " --json -");
  ASSERT_EQ(r.code, 0);
  const nlohmann::json d = nlohmann::json::parse(r.out);
  const double t = d["iteration_time_s"].get<double>();
  ASSERT_TRUE(d.contains("iteration_time_s_range")) << r.out.substr(0, 400);
  EXPECT_NEAR(d["iteration_time_s_range"][0].get<double>(), t * (1 + selene.published.min), 1e-9 * t);
  EXPECT_NEAR(d["iteration_time_s_range"][1].get<double>(), t * (1 + selene.published.max), 1e-9 * t);
  // A machine without published measurements has no such range.
  const CommandRun plain = run_tedsim("simulate --model tiny-moe --topology local-cpu --gpus 2 --tp 1 --ep 2 --global-batch 8 --json -");
  ASSERT_EQ(plain.code, 0);
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("iteration_time_s_range"));
}

TEST(Cli, StartupTableShowsTheMultiTokenPredictionModules) {
  const ModelSpec m = load_model(resolve_data_file("models", "deepseek-v3"));
  ASSERT_EQ(m.mtp_layers, 1);
  const CommandRun r = run_tedsim("simulate --model deepseek-v3 --topology dgx-h100 --gpus 256 --tp 1 --ep 8 --pp 8");
  ASSERT_EQ(r.code, 0);
  const std::string params = fixed((m.mtp_nonexpert_params() + m.mtp_expert_params()) / 1e9, 2) + " B";
  EXPECT_NE(r.out.find("1 module on the last stage"), std::string::npos) << r.out.substr(0, 2000);
  EXPECT_NE(r.out.find(params + " beside the parameters above"), std::string::npos) << params;
  const CommandRun plain = run_tedsim("simulate --model qwen3-30b-a3b --topology dgx-h100 --gpus 16 --tp 1 --ep 8");
  ASSERT_EQ(plain.code, 0);
  EXPECT_EQ(plain.out.find("multi-token"), std::string::npos);
}

}  // namespace
}  // namespace tedsim
