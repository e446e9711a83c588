// Gradient check on one rank: the hand-written backward of every parameter kind against central
// finite differences of the fp32 forward. Routing is made decisive (large gate weights) and every
// perturbation whose routing differs from the unperturbed one is skipped, so the loss is smooth in
// the perturbed element. Elements with the largest analytic gradient of each tensor are checked,
// where fp32 rounding of the loss is small against the difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "runtime_test_world.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::test {
namespace {

struct GradCase {
  Activation act;
  bool tied;
  TodaysMoe model = kTedModel;  // kTedModel: small_moe(2) with this activation and tying
};

class GradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheck, EveryParameterKindMatchesFiniteDifferences) {
  Communicator& world = runtime_world();
  if (world.size() != 1) GTEST_SKIP() << "gradient check runs on one rank";
  const GradCase k = GetParam();
  ModelSpec m = k.model == kTedModel ? small_moe(2, k.act, k.tied) : small_todays_moe(k.model);
  m.tie_embeddings = k.tied;
  if (k.model != kTedModel) {
    // Two layers (the dense first layer and one MoE layer where the model has one): fewer tokens
    // routed, so fewer near-ties for a perturbation to flip.
    m.layers = 2;
    if (m.moe.first_dense >= m.layers) m.moe.first_dense = 1;
  }
  ParallelConfig c;
  c.gpus = 1;
  c.micro_batch = 2;
  c.global_batch = 4;  // two micro-batches: gradient accumulation is part of the check
  c.recompute = Recompute::full;
  c.cac = true;
  c.zero = 0;
  runtime::TrainerOptions o;
  o.init_std = 0.2f;
  o.gate_init_std = k.model == kTedModel ? 1.0f : 2.0f;
  o.ln_init_noise = 0.2f;
  o.aux_loss_coef = 0.5f;  // large, so the aux-loss gradient path is visible in the gate's gradient
  o.mtp_loss_scale = 1.0f;  // likewise multi-token prediction's in the shared parameters
  runtime::Trainer tr(world, m, c, o);
  tr.loss_and_grads(0);
  const std::uint64_t sig = tr.routing_signature();
  runtime::ParamStore& ps = tr.params();
  std::vector<std::vector<float>> grads;
  for (std::size_t id = 0; id < ps.infos().size(); ++id) {
    const float* g = ps.grad(static_cast<int>(id));
    grads.emplace_back(g, g + ps.info(static_cast<int>(id)).numel);
  }
  std::set<std::string> kinds_checked;
  const float eps = k.model == kTedModel ? 2e-3f : 1e-3f;
  for (std::size_t id = 0; id < ps.infos().size(); ++id) {
    const runtime::ParamInfo& info = ps.info(static_cast<int>(id));
    const std::vector<float>& g = grads[id];
    std::vector<std::size_t> order(g.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
    int checked = 0;
    for (std::size_t n = 0; n < order.size() && n < 12 && checked < 3; ++n) {
      const std::size_t i = order[n];
      float* w = ps.param(static_cast<int>(id)) + i;
      const float w0 = *w;
      *w = w0 + eps;
      const double lp = tr.loss_only(0);
      const bool same_p = tr.routing_signature() == sig;
      *w = w0 - eps;
      const double lm = tr.loss_only(0);
      const bool same_m = tr.routing_signature() == sig;
      *w = w0;
      if (!same_p || !same_m) continue;  // routing flipped: the loss is not smooth here
      const double fd = (lp - lm) / (2.0 * static_cast<double>(eps));
      const double an = g[i];
      EXPECT_NEAR(an, fd, 2e-2 * std::max(std::fabs(an), std::fabs(fd)) + 2e-5)
          << info.name << " element " << i << ": analytic " << an << ", finite difference " << fd;
      ++checked;
    }
    EXPECT_GT(checked, 0) << info.name << ": every candidate element flipped routing";
    EXPECT_GT(std::fabs(g[order[0]]), 1e-4) << info.name << " has (almost) no gradient";
    kinds_checked.insert(info.kind);
  }
  std::set<std::string> expected = {"embedding", "final_ln", "ln",   "attn_qkv",   "attn_out",
                                    "mlp_fc1",   "mlp_fc2",  "gate", "expert_fc1", "expert_fc2"};
  if (!GetParam().tied) expected.insert("lm_head");
  if (m.moe.shared_experts > 0) expected.insert({"shared_fc1", "shared_fc2"});
  if (m.mtp_layers > 0) expected.insert("mtp_eh_proj");
  if (m.moe_layers() == m.layers) {
    expected.erase("mlp_fc1");
    expected.erase("mlp_fc2");
  }
  EXPECT_EQ(kinds_checked, expected);
}

std::string grad_case_name(const ::testing::TestParamInfo<GradCase>& p) {
  static const char* const models[] = {"", "_dropless_shared", "_sigmoid_groups", "_topk_softmax", "_mla", "_mla_direct_q", "_mtp"};
  return std::string(p.param.act == Activation::gelu ? "gelu" : "swiglu") + (p.param.tied ? "_tied" : "_untied") +
         models[p.param.model];
}

INSTANTIATE_TEST_SUITE_P(Runtime, GradCheck,
                         ::testing::Values(GradCase{Activation::gelu, true}, GradCase{Activation::swiglu, false},
                                           GradCase{Activation::swiglu, false, kDroplessShared},
                                           GradCase{Activation::gelu, true, kSigmoidGroups},
                                           GradCase{Activation::gelu, false, kTopkSoftmax},
                                           GradCase{Activation::swiglu, false, kMla},
                                           GradCase{Activation::swiglu, true, kMlaDirectQ},
                                           GradCase{Activation::swiglu, false, kMtp}, GradCase{Activation::swiglu, true, kMtp}),
                         grad_case_name);

}  // namespace
}  // namespace tedsim::test
