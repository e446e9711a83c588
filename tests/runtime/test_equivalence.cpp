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
  bool sp = false;  // sequence parallelism (t > 1)
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
  static const char* const models[] = {"", "_dropless_shared", "_sigmoid_groups", "_topk_softmax", "_mla", "_mla_direct_q", "_mtp"};
  return n + models[c.model] + (c.sp ? "_sp" : "");
}

ParallelConfig config_of(const EqCase& k) {
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
  c.sequence_parallel = k.sp;
  return c;
}

class Equivalence : public ::testing::TestWithParam<EqCase> {};

TEST_P(Equivalence, MatchesSingleRank) {
  const EqCase& k = GetParam();
  Communicator& world = runtime_world();
  if (world.size() != k.ranks) GTEST_SKIP() << "needs " << k.ranks << " ranks";
  const TrainRun& gold = golden(k.model);
  const ParallelConfig c = config_of(k);
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
        EqCase{4, 2, 2, kTed, true, true, true, false, 1, 1, 1, false, kTopkSoftmax},
        // MLA: replicated down projections whose gradients each tensor rank holds a share of.
        EqCase{1, 1, 1, kTed, false, false, false, true, 0, 1, 1, false, kMla},
        EqCase{2, 2, 1, kTed, false, false, false, true, 1, 1, 1, false, kMla},
        EqCase{2, 1, 2, kTed, false, true, true, true, 1, 1, 1, false, kMla},
        EqCase{4, 2, 2, kTed, false, false, false, true, 0, 1, 1, true, kMla},
        EqCase{4, 2, 1, kTed, false, false, false, true, 1, 2, 1, false, kMlaDirectQ},
        EqCase{4, 2, 2, kTed, false, false, false, true, 3, 1, 1, false, kMla},
        EqCase{4, 2, 2, kTed, false, false, false, false, 0, 1, 1, false, kMla, true},
        // Multi-token prediction (untied embeddings): eh_proj split over t, the layer's replay
        // under recompute and CAC, the last stage's embedding copy, ZeRO-3's module units, SP.
        EqCase{1, 1, 1, kTed, false, false, false, true, 0, 1, 1, false, kMtp},
        EqCase{2, 2, 1, kTed, false, false, false, true, 1, 1, 1, false, kMtp},
        EqCase{2, 1, 2, kTed, false, true, true, true, 1, 1, 1, false, kMtp},
        EqCase{2, 1, 1, kTed, false, false, false, true, 1, 2, 1, false, kMtp},
        EqCase{2, 2, 1, kTed, false, false, false, false, 0, 1, 1, false, kMtp, true},
        EqCase{4, 2, 2, kTed, false, false, false, true, 3, 1, 1, false, kMtp},
        EqCase{4, 2, 1, kTed, false, true, true, false, 3, 2, 1, false, kMtp, true},
        EqCase{4, 1, 2, kTed, false, false, false, true, 1, 2, 1, true, kMtp},
        // Sequence parallelism: {..., model, sp}; with and without expert TP, CAC, selective
        // recompute, pipelines, ZeRO-1 and today's routers (dropless: without expert TP).
        EqCase{2, 2, 1, kTed, false, false, false, true, 0, 1, 1, false, kTedModel, true},
        EqCase{2, 2, 1, kTed, false, true, true, false, 1, 1, 1, false, kTedModel, true},
        EqCase{2, 2, 1, kTed, false, false, false, true, 0, 1, 1, true, kTedModel, true},
        EqCase{4, 2, 2, kTed, false, false, false, true, 1, 1, 1, false, kTedModel, true},
        EqCase{4, 2, 2, kDbe, false, true, true, false, 0, 1, 1, false, kTedModel, true},
        EqCase{4, 2, 1, kTed, false, false, false, true, 0, 2, 1, false, kTedModel, true},
        EqCase{4, 2, 1, kTed, false, true, true, true, 1, 2, 1, false, kTedModel, true},
        EqCase{4, 2, 2, kTed, false, false, false, false, 0, 1, 1, false, kDroplessShared, true},
        EqCase{4, 2, 2, kTed, false, false, false, true, 1, 1, 1, false, kTopkSoftmax, true},
        EqCase{2, 2, 1, kTed, false, false, true, false, 0, 1, 1, false, kSigmoidGroups, true},
        EqCase{8, 2, 2, kTed, false, false, false, true, 1, 2, 1, false, kTedModel, true},
        // ZeRO-3 (parameters gathered per unit, gradients reduce-scattered per layer and micro-batch):
        // non-expert and expert shards, recompute and CAC, pipelines (tied embeddings across
        // stages), SP, dropless.
        EqCase{2, 1, 1, kTed, false, false, false, true, 3}, EqCase{2, 1, 2, kTed, false, true, true, true, 3},
        EqCase{4, 1, 2, kTed, false, false, false, true, 3}, EqCase{4, 1, 2, kDbe, false, true, true, true, 3},
        EqCase{4, 2, 2, kTed, true, false, true, false, 3},
        EqCase{4, 2, 2, kTed, false, false, false, true, 3, 1, 1, false, kTedModel, true},
        EqCase{4, 1, 1, kTed, false, false, false, true, 3, 2, 1}, EqCase{4, 1, 1, kTed, false, true, true, true, 3, 2, 2},
        EqCase{4, 1, 1, kTed, false, false, false, true, 3, 1, 1, true},
        EqCase{4, 1, 4, kTed, false, false, false, true, 3, 1, 1, false, kDroplessShared},
        EqCase{8, 2, 2, kTed, false, true, true, true, 3, 2, 1, false, kTedModel, true},
        EqCase{8, 2, 2, kDbe, false, false, false, true, 3}),
    [](const ::testing::TestParamInfo<EqCase>& p) { return name_of(p.param); });

// Gradients before any optimizer step: Adam's per-element normalization hides a gradient that is
// a part of the right one (a tensor rank's share of a replicated parameter's, say), so the losses
// and checksums after 3 steps above cannot catch it; the gradients themselves can. Per kind:
// sum over every rank of w(global index) * grad, the replicas' partial gradients adding up to the
// global batch's (what the data sync would make of them); a parameter every tensor rank holds
// whole counts 1/t per rank, all tensor ranks holding the same gradient. The |grad| sum is the
// golden run's scale for the tolerance.
std::map<std::string, std::pair<double, double>> gradient_sums(runtime::Trainer& tr, Communicator& comm, int tp) {
  std::map<std::string, std::pair<double, double>> local;
  runtime::ParamStore& store = tr.params();
  for (std::size_t id = 0; id < store.infos().size(); ++id) {
    const runtime::ParamInfo& p = store.info(static_cast<int>(id));
    const std::vector<float> g = tr.grad_to_host(static_cast<int>(id));
    const double share = p.tp_replicated ? 1.0 / tp : 1.0;
    auto& [weighted, abs] = local[p.kind];
    for (std::size_t i = 0; i < p.numel; ++i) {
      const std::uint64_t hsh = runtime::mix64(static_cast<std::uint64_t>(p.tensor_id) * 1000003ULL + p.slice.global_index(i));
      weighted += share * (1.0 + static_cast<double>(hsh & 0xff) / 256.0) * g[i];
      abs += share * std::fabs(g[i]);
    }
  }
  // Every rank's sums of every kind, through host_max (each rank fills its own slots).
  static const std::vector<std::string> kinds = {"embedding", "lm_head",    "final_ln",   "ln",       "attn_qkv",
                                                 "attn_out",  "mlp_fc1",    "mlp_fc2",    "gate",     "expert_fc1",
                                                 "expert_fc2", "shared_fc1", "shared_fc2", "mtp_eh_proj"};
  const int n = comm.size(), K = static_cast<int>(kinds.size());
  std::vector<double> all(static_cast<std::size_t>(n) * K * 2, -1e300);
  for (int k = 0; k < K; ++k) {
    all[(static_cast<std::size_t>(comm.rank()) * K + k) * 2] = local[kinds[k]].first;
    all[(static_cast<std::size_t>(comm.rank()) * K + k) * 2 + 1] = local[kinds[k]].second;
  }
  comm.host_max(all);
  std::map<std::string, std::pair<double, double>> sums;
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < n; ++r) {
      sums[kinds[k]].first += all[(static_cast<std::size_t>(r) * K + k) * 2];
      sums[kinds[k]].second += all[(static_cast<std::size_t>(r) * K + k) * 2 + 1];
    }
  return sums;
}

class GradientEquivalence : public ::testing::TestWithParam<EqCase> {};

TEST_P(GradientEquivalence, MatchesSingleRankBeforeTheOptimizer) {
  const EqCase& k = GetParam();
  Communicator& world = runtime_world();
  if (world.size() != k.ranks) GTEST_SKIP() << "needs " << k.ranks << " ranks";
  std::map<std::string, std::pair<double, double>> gold;
  {
    auto sub = world.split(world.rank() == 0 ? std::vector<int>{0} : [&] {
      std::vector<int> rest;
      for (int r = 1; r < world.size(); ++r) rest.push_back(r);
      return rest;
    }(), world.rank() == 0 ? "golden" : "idle");
    if (world.rank() == 0) {
      ParallelConfig c;
      c.gpus = 1;
      c.micro_batch = kMicroBatch;
      c.global_batch = kGlobalBatch;
      c.recompute = Recompute::none;
      runtime::Trainer tr(*sub, equivalence_model(k.model), c, equivalence_options());
      tr.loss_and_grads(0);
      gold = gradient_sums(tr, *sub, 1);
    }
    world.barrier();
  }
  ParallelConfig c = config_of(k);
  c.zero = 0;  // gradients before any sync
  runtime::Trainer tr(world, equivalence_model(k.model), c, equivalence_options());
  tr.loss_and_grads(0);
  const auto sums = gradient_sums(tr, world, k.tp);
  if (world.rank() != 0) return;
  for (const auto& [kind, g] : gold) {
    const auto& got = sums.at(kind);
    // Linear in the gradients, so partial gradients of replicas add up; |g| sums would not.
    EXPECT_NEAR(got.first, g.first, 1e-4 * g.second + 1e-12) << "weighted gradient of " << kind;
  }
}

// {ranks, t, e, layout, dtd, cac, checkpoint, expert_tp, zero, pp, vpp, selective, model, sp}
INSTANTIATE_TEST_SUITE_P(
    Runtime, GradientEquivalence,
    ::testing::Values(EqCase{2, 2, 1, kTed, true, false, false, true, 0},
                      EqCase{2, 2, 1, kTed, false, false, false, true, 0, 1, 1, false, kTedModel, true},
                      EqCase{2, 2, 1, kTed, false, false, false, false, 0, 1, 1, false, kTedModel, true},
                      EqCase{2, 2, 1, kTed, false, true, true, true, 0, 1, 1, false, kTedModel, true},
                      EqCase{2, 2, 1, kTed, false, false, false, false, 0, 1, 1, false, kDroplessShared, true},
                      EqCase{2, 2, 1, kTed, false, false, false, true, 0, 1, 1, false, kTopkSoftmax, true},
                      EqCase{2, 2, 1, kTed, false, false, false, true, 0, 1, 1, false, kMla},
                      EqCase{2, 2, 1, kTed, false, false, false, false, 0, 1, 1, false, kMla, true},
                      EqCase{2, 2, 1, kTed, false, false, false, true, 0, 1, 1, false, kMlaDirectQ},
                      EqCase{2, 2, 1, kTed, false, false, false, true, 0, 1, 1, false, kTopkSoftmax},
                      EqCase{4, 2, 2, kTed, false, false, false, true, 0, 1, 1, false, kTedModel, true},
                      EqCase{4, 2, 1, kTed, false, false, false, true, 0, 2, 1, false, kTedModel, true}),
    [](const ::testing::TestParamInfo<EqCase>& p) { return name_of(p.param); });

}  // namespace
}  // namespace tedsim::test
