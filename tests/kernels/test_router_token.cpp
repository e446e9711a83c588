// The CUDA routers' per-token code (kernels/cuda/router_token.hpp: the bodies of router.cu's
// kernels) run on the host against the CPU router, so the logic of the GPU kernels is checked on
// every machine; tests/gpu/test_gpu_router.cpp checks the kernels themselves where a GPU is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "router_cases.hpp"
#include "tedsim/kernels/cpu/router.hpp"
#include "tedsim/kernels/cuda/router_token.hpp"
#include "test_util.hpp"

namespace tedsim::kernels {
namespace {

namespace tok = cuda::router_token;
using test::expect_close;
using test::kRouterCases;
using test::random_vector;
using test::RouterCase;

// The kernels' forward, token by token: the choices and their weights before dropping, then
// (given the CPU's positions, which moe.cu's shared position kernel computes) the final weights.
struct TokenRouting {
  std::vector<float> probs, scores, chosen_weight, weight;
  std::vector<int> expert, top1_count;
};

TokenRouting route_by_token(const std::vector<float>& logits, const RouterCase& c, const GatingOutput& positions_from) {
  const int T = c.tokens, E = c.experts, k = c.cfg.k;
  const bool sigmoid = c.cfg.kind == RouterKind::sigmoid;
  TokenRouting r;
  r.probs.assign(std::size_t(T) * E, -1.0f);
  r.scores.assign(sigmoid ? std::size_t(T) * E : 0, -1.0f);
  r.chosen_weight.assign(std::size_t(T) * k, -1.0f);
  r.weight.assign(std::size_t(T) * k, -1.0f);
  r.expert.assign(std::size_t(T) * k, -1);
  r.top1_count.assign(E, 0);
  const tok::ChooseArgs a{E, k, c.cfg.groups, c.cfg.topk_groups, c.cfg.kind, c.cfg.normalize};
  for (int t = 0; t < T; ++t)
    ++r.top1_count[tok::choose(a, t, logits.data(), r.probs.data(), r.scores.data(), r.expert.data(),
                               r.chosen_weight.data())];
  const bool renormalize = c.cfg.kind == RouterKind::softmax_topk && c.cfg.normalize;
  const std::vector<int> position(positions_from.position.begin(), positions_from.position.end());
  for (int t = 0; t < T; ++t)
    tok::weigh(t, k, renormalize, c.cfg.scaling, position.data(), r.chosen_weight.data(), r.weight.data());
  return r;
}

TEST(RouterToken, ForwardMatchesTheCpuRouter) {
  for (const RouterCase& c : kRouterCases) {
    const auto logits = random_vector(std::size_t(c.tokens) * c.experts, 91, -2, 2);
    RouterOutput cpu;
    route_forward(logits.data(), nullptr, c.tokens, c.experts, c.cfg, cpu);
    const TokenRouting r = route_by_token(logits, c, cpu.gate);
    const std::string what = c.name;
    EXPECT_EQ(r.expert, std::vector<int>(cpu.gate.expert.begin(), cpu.gate.expert.end())) << what;
    EXPECT_EQ(r.top1_count, std::vector<int>(cpu.gate.top1_count.begin(), cpu.gate.top1_count.end())) << what;
    expect_close(r.probs, cpu.gate.probs, 1e-6, 0, (what + " probs").c_str());
    expect_close(r.scores, cpu.scores, 1e-6, 0, (what + " scores").c_str());
    expect_close(r.chosen_weight, cpu.chosen_weight, 1e-6, 0, (what + " chosen weights").c_str());
    expect_close(r.weight, cpu.gate.weight, 1e-6, 0, (what + " weights").c_str());
    // The case exercises what its name says: dropped choices with a capacity, none dropless.
    int dropped = 0;
    for (std::int32_t p : cpu.gate.position) dropped += p < 0;
    EXPECT_EQ(dropped > 0, c.cfg.drop_tokens) << what;
  }
}

TEST(RouterToken, GroupLimitKeepsEveryChoiceInsideTheOpenGroups) {
  const RouterCase& c = kRouterCases[6];  // sigmoid, 64 experts in 8 groups, 4 groups open, top-8
  const auto logits = random_vector(std::size_t(c.tokens) * c.experts, 94, -2, 2);
  RouterOutput cpu;
  route_forward(logits.data(), nullptr, c.tokens, c.experts, c.cfg, cpu);
  const TokenRouting r = route_by_token(logits, c, cpu.gate);
  const int per_group = c.experts / c.cfg.groups;
  for (int t = 0; t < c.tokens; ++t) {
    std::vector<int> groups;
    for (int j = 0; j < c.cfg.k; ++j) {
      const int g = r.expert[std::size_t(t) * c.cfg.k + j] / per_group;
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
    EXPECT_LE(int(groups.size()), c.cfg.topk_groups) << "token " << t;
  }
}

TEST(RouterToken, TiesGoToTheLowestIndex) {
  for (const RouterCase& c : {kRouterCases[1], kRouterCases[3], kRouterCases[6]}) {
    const std::vector<float> logits(std::size_t(c.tokens) * c.experts, 0.25f);
    RouterOutput cpu;
    route_forward(logits.data(), nullptr, c.tokens, c.experts, c.cfg, cpu);
    const TokenRouting r = route_by_token(logits, c, cpu.gate);
    EXPECT_EQ(r.expert, std::vector<int>(cpu.gate.expert.begin(), cpu.gate.expert.end())) << c.name;
    for (int j = 0; j < c.cfg.k; ++j) EXPECT_EQ(r.expert[j], j) << c.name;
  }
}

TEST(RouterToken, BackwardMatchesTheCpuRouter) {
  for (const RouterCase& c : kRouterCases) {
    const auto logits = random_vector(std::size_t(c.tokens) * c.experts, 92, -2, 2);
    RouterOutput cpu;
    route_forward(logits.data(), nullptr, c.tokens, c.experts, c.cfg, cpu);
    const auto grad_weight = random_vector(std::size_t(c.tokens) * c.cfg.k, 93);
    // The balance loss over this rank's tokens, and over a tensor group's three times as many (SP).
    for (int aux_tokens : {0, 3 * c.tokens}) {
      cpu.gate.aux_tokens = aux_tokens;
      for (float grad_aux : {0.0f, 0.37f}) {
        std::vector<float> ref(std::size_t(c.tokens) * c.experts), got(ref.size(), 12345.0f);
        route_backward(cpu, grad_weight.data(), grad_aux, ref.data());
        const tok::BackwardArgs a{c.experts, c.cfg.k, aux_tokens > 0 ? aux_tokens : c.tokens, c.cfg.kind,
                                  c.cfg.normalize, c.cfg.scaling, grad_aux};
        const std::vector<int> expert(cpu.gate.expert.begin(), cpu.gate.expert.end());
        const std::vector<int> position(cpu.gate.position.begin(), cpu.gate.position.end());
        const std::vector<int> top1(cpu.gate.top1_count.begin(), cpu.gate.top1_count.end());
        for (int t = 0; t < c.tokens; ++t)
          tok::backward(a, t, cpu.gate.probs.data(), cpu.scores.data(), expert.data(), position.data(),
                        cpu.chosen_weight.data(), top1.data(), grad_weight.data(), got.data());
        const std::string what = std::string(c.name) + " aux tokens " + std::to_string(aux_tokens) + " grad_aux " +
                                 std::to_string(grad_aux);
        // Cancellation (q (dq - <dq, q>)) leaves entries near zero whose rounding follows the
        // compiler's contractions into FMAs: the noise scales with the row's largest entries.
        double largest = 0;
        for (float x : ref) largest = std::max(largest, double(std::abs(x)));
        expect_close(got, ref, 1e-6, 1e-6 * largest, what.c_str());
      }
    }
  }
}

}  // namespace
}  // namespace tedsim::kernels
