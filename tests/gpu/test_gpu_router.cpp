// Today's routers on the device (cuda::route_forward / route_backward) against the CPU router
// (kernels/cpu/router.hpp), the reference whose own tests check it against plain fp64 loops. Every
// router kind, with and without renormalization, group-limited, with a capacity that drops choices
// and dropless; ties; the backward on the device's own choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/router.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"
#include "../kernels/router_cases.hpp"
#include "gpu_device_arrays.hpp"
#include "gpu_test_support.hpp"

namespace tedsim::kernels {
namespace {

namespace cu = tedsim::kernels::cuda;
using gpu_test::DevF;
using gpu_test::expect_close;
using gpu_test::expect_close_to_max;
using gpu_test::kGarbage;
using gpu_test::random_vector;
using GpuRouter = gpu_test::Gpu;

using test::RouterCase;
using test::kRouterCases;
using test::router_config;

// The device's routing, downloaded.
RouterOutput route_on_device(const std::vector<float>& logits, const RouterCase& c, cu::DeviceRouter& dev) {
  DevF dlogits(logits);
  cu::route_forward(dlogits.ptr(), c.tokens, c.experts, c.cfg, dev);
  RouterOutput out;
  dev.download(out);
  return out;
}

void expect_same_routing(const RouterOutput& gpu, const RouterOutput& cpu, const std::string& what) {
  const GatingOutput &g = gpu.gate, &r = cpu.gate;
  EXPECT_EQ(g.capacity, r.capacity) << what;
  EXPECT_EQ(g.expert, r.expert) << what;
  EXPECT_EQ(g.position, r.position) << what;
  EXPECT_EQ(g.routed, r.routed) << what;
  EXPECT_EQ(g.kept, r.kept) << what;
  EXPECT_EQ(g.top1_count, r.top1_count) << what;
  expect_close(g.probs, r.probs, 1e-5, 1e-7, what + " probs");
  expect_close(gpu.scores, cpu.scores, 1e-5, 1e-7, what + " scores");
  expect_close(gpu.chosen_weight, cpu.chosen_weight, 1e-5, 1e-7, what + " chosen weights");
  expect_close(g.weight, r.weight, 1e-5, 1e-7, what + " weights");
  EXPECT_NEAR(g.aux_loss, r.aux_loss, 1e-5 * (std::abs(r.aux_loss) + 1e-3)) << what;
}

TEST_F(GpuRouter, ForwardMatchesCpu) {
  for (const RouterCase& c : kRouterCases) {
    const auto logits = random_vector(static_cast<std::size_t>(c.tokens) * c.experts, 91, -2, 2);
    RouterOutput cpu;
    route_forward(logits.data(), nullptr, c.tokens, c.experts, c.cfg, cpu);
    cu::DeviceRouter dev;
    const RouterOutput gpu = route_on_device(logits, c, dev);
    expect_same_routing(gpu, cpu, c.name);
    const bool drops = std::any_of(cpu.gate.position.begin(), cpu.gate.position.end(), [](int p) { return p < 0; });
    EXPECT_EQ(drops, c.cfg.drop_tokens) << c.name << ": the case must exercise what its name says";
  }
}

TEST_F(GpuRouter, TiesGoToTheLowestIndexAsOnTheCpu) {
  // Equal logits in every row (and equal groups): the first experts and groups win everywhere.
  for (const RouterCase& c : {kRouterCases[1], kRouterCases[3], kRouterCases[6]}) {
    std::vector<float> logits(static_cast<std::size_t>(c.tokens) * c.experts, 0.25f);
    RouterOutput cpu;
    route_forward(logits.data(), nullptr, c.tokens, c.experts, c.cfg, cpu);
    cu::DeviceRouter dev;
    const RouterOutput gpu = route_on_device(logits, c, dev);
    expect_same_routing(gpu, cpu, std::string(c.name) + " ties");
    for (int j = 0; j < c.cfg.k; ++j) EXPECT_EQ(gpu.gate.expert[j], j) << c.name;
  }
}

TEST_F(GpuRouter, BackwardMatchesCpu) {
  for (const RouterCase& c : kRouterCases) {
    const auto logits = random_vector(static_cast<std::size_t>(c.tokens) * c.experts, 92, -2, 2);
    cu::DeviceRouter dev;
    const RouterOutput fwd = route_on_device(logits, c, dev);  // the CPU backward sees the same choices
    const auto grad_weight = random_vector(static_cast<std::size_t>(c.tokens) * c.cfg.k, 93);
    for (float grad_aux : {0.0f, 0.37f}) {
      std::vector<float> ref(static_cast<std::size_t>(c.tokens) * c.experts);
      route_backward(fwd, grad_weight.data(), grad_aux, ref.data());
      DevF dgw(grad_weight), dgl(ref.size(), kGarbage);
      cu::route_backward(dev, dgw.ptr(), grad_aux, dgl.ptr());
      expect_close_to_max(dgl.host(), ref, 1e-5, std::string(c.name) + " backward, grad_aux " + std::to_string(grad_aux));
    }
  }
}

TEST_F(GpuRouter, RejectsWhatTheCpuRejects) {
  cu::DeviceRouter dev;
  DevF logits(std::vector<float>(64, 0.0f));
  RouterConfig too_many = router_config(RouterKind::softmax_topk, 9, false, 1.0f, 1, 1, 1.0);
  EXPECT_THROW(cu::route_forward(logits.ptr(), 4, 16, too_many, dev), InputError);
  RouterConfig uneven_groups = router_config(RouterKind::sigmoid, 4, false, 1.0f, 3, 2, 0);
  EXPECT_THROW(cu::route_forward(logits.ptr(), 4, 16, uneven_groups, dev), InputError);
}

}  // namespace
}  // namespace tedsim::kernels
