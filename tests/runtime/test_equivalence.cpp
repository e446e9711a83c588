// Parallel equivalence under real mpirun: every (t, e, layout, DTD, CAC, checkpointing, ZeRO,
// expert TP) configuration of the world trains the same global model on the same global batches
// (same micro-batch size, no token dropped), so its losses and parameter checksums after 3 steps
// must match a single-rank golden run (relative 1e-4). The golden run is computed in the same
// process: rank 0 runs a 1-rank replica on its own sub-communicator before the parallel runs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "runtime_test_world.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::test {
namespace {

constexpr int kSteps = 3;
constexpr int kGlobalBatch = 8;
constexpr int kMicroBatch = 2;

struct TrainRun {
  std::vector<double> losses;
  std::vector<runtime::Checksum> sums;
};

ModelSpec equivalence_model(int kind) {
  return kind == kTedModel ? small_moe(4, Activation::gelu, true) : small_todays_moe(static_cast<TodaysMoe>(kind));
}

runtime::TrainerOptions equivalence_options() {
  runtime::TrainerOptions o;
  o.gate_init_std = 0.5f;  // decisive routing: rounding differences never flip a choice
  o.lr = 1e-3f;
  return o;
}

TrainRun train(Communicator& comm, const ParallelConfig& c, int model) {
  runtime::Trainer tr(comm, equivalence_model(model), c, equivalence_options());
  TrainRun r;
  for (int i = 0; i < kSteps; ++i) r.losses.push_back(tr.step().loss);
  r.sums = tr.checksums();
  return r;
}

const TrainRun& golden(int model) {
  static std::map<int, TrainRun> runs;
  if (runs.count(model)) return runs[model];
  runs[model] = [model] {
    Communicator& world = runtime_world();
    const int rank = world.rank();
    std::vector<int> members;
    if (rank == 0) {
      members = {0};
    } else {
      for (int r = 1; r < world.size(); ++r) members.push_back(r);
    }
    auto sub = world.split(members, rank == 0 ? "golden" : "idle");
    TrainRun run;
    if (rank == 0) {
      ParallelConfig c;
      c.gpus = 1;
      c.micro_batch = kMicroBatch;
      c.global_batch = kGlobalBatch;
      c.recompute = Recompute::none;
      c.zero = 0;
      run = train(*sub, c, model);
    }
    world.barrier();
    return run;
  }();
  return runs[model];
}

struct EqCase {
  int ranks, tp, ep;
  RankLayout layout;
  bool dtd, cac, checkpoint, expert_tp;
  int zero;
  int pp = 1, vpp = 1;
  bool selective = false;  // selective recompute of the attention core (with checkpoint false)
  int model = kTedModel;
};

std::string name_of(const EqCase& c) {
  std::string n = "np" + std::to_string(c.ranks);
  if (c.pp > 1) n += "_p" + std::to_string(c.pp) + (c.vpp > 1 ? "v" + std::to_string(c.vpp) : "");
  n += "_t" + std::to_string(c.tp) + "e" + std::to_string(c.ep);
  n += c.layout == RankLayout::ted ? "_ted" : "_dbe";
  n += c.dtd ? "_dtd" : "_nodtd";
  n += c.checkpoint ? (c.cac ? "_cac" : "_ckpt") : c.selective ? "_sel" : "_nockpt";
  n += c.expert_tp ? "_etp" : "_noetp";
  n += "_zero" + std::to_string(c.zero);
  static const char* const models[] = {"", "_dropless_shared", "_sigmoid_groups", "_topk_softmax"};
  return n + models[c.model];
}

class Equivalence : public ::testing::TestWithParam<EqCase> {};

TEST_P(Equivalence, MatchesSingleRank) {
  const EqCase& k = GetParam();
  Communicator& world = runtime_world();
  if (world.size() != k.ranks) GTEST_SKIP() << "needs " << k.ranks << " ranks";
  const TrainRun& gold = golden(k.model);
  ParallelConfig c;
  c.gpus = k.ranks;
  c.tp = k.tp;
  c.ep = k.ep;
  c.micro_batch = kMicroBatch;
  c.global_batch = kGlobalBatch;
  c.layout = k.layout;
  c.dtd = k.dtd;
  c.cac = k.cac;
  c.recompute = k.checkpoint ? Recompute::full : k.selective ? Recompute::selective : Recompute::none;
  c.expert_tp = k.expert_tp;
  c.zero = k.zero;
  c.pp = k.pp;
  c.vpp = k.vpp;
  const TrainRun run = train(world, c, k.model);
  if (world.rank() != 0) return;  // the golden run lives on rank 0; losses and checksums are global
  ASSERT_EQ(run.losses.size(), gold.losses.size());
  for (std::size_t i = 0; i < run.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], gold.losses[i], 1e-4 * std::fabs(gold.losses[i])) << "loss of step " << i;
  EXPECT_LT(run.losses.back(), run.losses.front()) << "training did not lower the loss";
  ASSERT_EQ(run.sums.size(), gold.sums.size());
  for (std::size_t i = 0; i < run.sums.size(); ++i) {
    EXPECT_EQ(run.sums[i].kind, gold.sums[i].kind);
    EXPECT_NEAR(run.sums[i].abs, gold.sums[i].abs, 1e-4 * gold.sums[i].abs) << run.sums[i].kind;
    EXPECT_NEAR(run.sums[i].weighted, gold.sums[i].weighted, 1e-4 * gold.sums[i].abs + 1e-12) << run.sums[i].kind;
  }
}

constexpr RankLayout kTed = RankLayout::ted;
constexpr RankLayout kDbe = RankLayout::data_before_expert;

// {ranks, t, e, layout, dtd, cac, checkpoint, expert_tp, zero}
INSTANTIATE_TEST_SUITE_P(
    Runtime, Equivalence,
    ::testing::Values(
        // 2 ranks
        EqCase{2, 2, 1, kTed, true, true, true, true, 1}, EqCase{2, 2, 1, kTed, false, false, false, true, 0},
        EqCase{2, 2, 1, kTed, true, false, true, false, 1}, EqCase{2, 1, 2, kTed, false, true, true, true, 1},
        EqCase{2, 1, 2, kDbe, true, false, false, true, 0}, EqCase{2, 1, 1, kTed, false, false, true, true, 1},
        // 4 ranks
        EqCase{4, 2, 2, kTed, true, true, true, true, 1}, EqCase{4, 2, 2, kDbe, false, false, true, true, 0},
        EqCase{4, 2, 2, kTed, true, false, false, false, 1}, EqCase{4, 2, 2, kDbe, true, true, true, false, 0},
        EqCase{4, 1, 4, kTed, false, true, true, true, 1}, EqCase{4, 1, 2, kDbe, true, false, false, true, 1},
        EqCase{4, 1, 2, kTed, false, false, true, true, 0}, EqCase{4, 2, 1, kTed, true, true, true, true, 1},
        EqCase{4, 2, 1, kDbe, false, false, false, false, 0},
        // 8 ranks (oversubscribed)
        EqCase{8, 2, 2, kTed, true, true, true, true, 1}, EqCase{8, 2, 2, kDbe, false, false, false, false, 0},
        // Pipeline stages: {..., pp, vpp}; 1F1B and interleaved, with and without recompute.
        EqCase{2, 1, 1, kTed, false, false, false, true, 0, 2, 1}, EqCase{2, 1, 1, kTed, false, true, true, true, 1, 2, 1},
        EqCase{4, 2, 1, kTed, true, true, true, true, 1, 2, 1}, EqCase{4, 2, 1, kTed, false, false, false, false, 0, 2, 1},
        EqCase{4, 1, 2, kTed, false, false, false, true, 1, 2, 1}, EqCase{4, 1, 2, kDbe, false, true, true, true, 0, 2, 1},
        EqCase{4, 1, 1, kTed, false, false, false, true, 0, 4, 1}, EqCase{4, 1, 1, kTed, false, true, true, true, 1, 4, 1},
        EqCase{4, 1, 1, kTed, false, false, false, true, 1, 2, 2}, EqCase{4, 1, 1, kTed, false, true, true, true, 0, 2, 2},
        EqCase{8, 2, 2, kTed, true, true, true, true, 1, 2, 1}, EqCase{8, 2, 2, kTed, false, false, false, true, 0, 2, 1},
        // Selective recompute of the attention core: {..., pp, vpp, selective}.
        EqCase{1, 1, 1, kTed, false, false, false, true, 0, 1, 1, true},
        EqCase{2, 2, 1, kTed, true, false, false, true, 1, 1, 1, true},
        EqCase{4, 1, 1, kTed, false, false, false, true, 1, 2, 2, true},
        EqCase{4, 2, 2, kTed, true, false, false, true, 0, 1, 1, true},
        // Today's shapes: {..., pp, vpp, selective, model}. Dropless needs expert TP without DTD.
        EqCase{1, 1, 1, kTed, false, false, false, true, 0, 1, 1, false, kDroplessShared},
        EqCase{2, 1, 2, kTed, false, false, false, true, 0, 1, 1, false, kDroplessShared},
        EqCase{2, 1, 2, kTed, false, true, true, true, 1, 1, 1, false, kDroplessShared},
        EqCase{4, 2, 2, kTed, false, false, false, true, 1, 1, 1, false, kDroplessShared},
        EqCase{4, 2, 2, kDbe, false, true, true, true, 0, 1, 1, false, kDroplessShared},
        EqCase{4, 1, 4, kTed, false, false, true, true, 1, 1, 1, false, kDroplessShared},
        EqCase{8, 2, 2, kTed, false, false, false, true, 0, 1, 1, false, kDroplessShared},
        EqCase{4, 1, 2, kTed, false, false, false, true, 0, 2, 1, false, kDroplessShared},
        EqCase{2, 1, 2, kTed, false, false, false, true, 0, 1, 1, false, kSigmoidGroups},
        EqCase{4, 2, 2, kTed, false, true, true, true, 1, 1, 1, false, kSigmoidGroups},
        EqCase{4, 1, 4, kTed, false, false, false, true, 0, 1, 1, false, kSigmoidGroups},
        EqCase{2, 2, 1, kTed, true, false, false, true, 0, 1, 1, false, kTopkSoftmax},
        EqCase{4, 2, 2, kTed, true, true, true, false, 1, 1, 1, false, kTopkSoftmax}),
    [](const ::testing::TestParamInfo<EqCase>& p) { return name_of(p.param); });

}  // namespace
}  // namespace tedsim::test
