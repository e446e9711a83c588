// The host's side of a step (model/host_launch.hpp): hand-computed waits of small blocks with and
// without a device-to-host sync and with CUDA graphs, and what the workload builds from them.
#include <gtest/gtest.h>

#include <cstring>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/host_launch.hpp"
#include "tedsim/model/layer_ops.hpp"
#include "tedsim/sim/simulator.hpp"

namespace tedsim {
namespace {

constexpr double kUs = 1e-6;

Op op(const char* name, double gpu_us, double calls = 1, std::uint8_t scope = 0, bool sync = false) {
  Op o;
  o.name = name;
  o.seconds = gpu_us * kUs;
  o.host_calls = calls;
  o.graph_scope = scope;
  o.host_sync = sync;
  return o;
}

// Without a sync the host runs ahead of the device; it holds it back only by what its calls take
// beyond the device's work: 3 calls x 15 us = 45 us against 10 + 10 + 5 us.
TEST(HostLaunch, WithoutASyncTheDeviceWaitsOnlyForTheHostsExcess) {
  Block b;
  b.add(op("a", 10));
  b.add(op("b", 10));
  b.add(op("c", 5));
  const HostLaunchWait w = host_launch_wait(b, 15 * kUs, 0);
  EXPECT_NEAR(w.host_s, 45 * kUs, 1e-12);
  EXPECT_NEAR(w.wait_s, 20 * kUs, 1e-12);
  EXPECT_EQ(host_launch_wait(b, 4 * kUs, 0).wait_s, 0.0);  // host faster than the device: no wait
}

// After a sync the device's queue is empty: from the op after it (b), the host issues b at 10 us,
// b runs to 110; c is issued at 20, runs 110-111; a at 30, runs 111-116 and syncs. The device
// worked 106 us of the 116: the wait is the first call's 10 us.
TEST(HostLaunch, AfterASyncTheDeviceWaitsForTheFirstCalls) {
  Block b;
  b.add(op("a", 5, 1, 0, true));
  b.add(op("b", 100));
  b.add(op("c", 1));
  EXPECT_NEAR(host_launch_wait(b, 10 * kUs, 0).wait_s, 10 * kUs, 1e-12);
  // Many calls on short kernels after the sync: 20 calls of c (200 us of host) before its 1 us.
  Block slow;
  slow.add(op("a", 5, 1, 0, true));
  slow.add(op("c", 1, 20));
  slow.add(op("b", 100));
  // c issued at 200, runs 200-201; b issued at 210, runs 210-310; a issued at 220, runs 310-315.
  EXPECT_NEAR(host_launch_wait(slow, 10 * kUs, 0).wait_s, (315.0 - 106.0) * kUs, 1e-12);
}

// The host's own code after the sync returns (Op::host_resume_calls) comes before the first launch
// with the device's queue empty: 30 calls' worth (300 us) delays b by all of it. Host: b issued
// at 310, c at 320, a at 330; device: b 310-410, c 410-411, a 411-416. The wait is 416 - 106 us.
// The host's total counts the resume once, beside the three ops' calls.
TEST(HostLaunch, TheHostsCodeAfterASyncIsWaitedForInFull) {
  Block b;
  Op sync = op("a", 5, 1, 0, true);
  sync.host_resume_calls = 30;
  b.add(sync);
  b.add(op("b", 100));
  b.add(op("c", 1));
  const HostLaunchWait w = host_launch_wait(b, 10 * kUs, 0);
  EXPECT_NEAR(w.wait_s, (416.0 - 106.0) * kUs, 1e-12);
  EXPECT_NEAR(w.host_s, 330 * kUs, 1e-12);
  // A graph over the synchronising op does not remove the code after it, which runs eager.
  Block graphed;
  Op captured = sync;
  captured.graph_scope = kGraphMoePreprocess;
  graphed.add(captured);
  graphed.add(op("b", 100));
  graphed.add(op("c", 1));
  EXPECT_NEAR(host_launch_wait(graphed, 10 * kUs, kGraphMoePreprocess).wait_s, (416.0 - 106.0) * kUs, 1e-12);
}

// A captured region replays for one call: three attention ops of 5 calls each cost 10 us of host
// together instead of 150.
TEST(HostLaunch, ACapturedRegionCostsOneCall) {
  Block b;
  b.add(op("norm", 1, 5, kGraphAttn));
  b.add(op("qkv", 1, 5, kGraphAttn));
  b.add(op("core", 1, 5, kGraphAttn));
  b.add(op("router", 1, 5, kGraphMoeRouter));
  EXPECT_NEAR(host_launch_wait(b, 10 * kUs, 0).host_s, 200 * kUs, 1e-12);
  EXPECT_NEAR(host_launch_wait(b, 10 * kUs, kGraphAttn).host_s, 60 * kUs, 1e-12);
  EXPECT_NEAR(host_launch_wait(b, 10 * kUs, kGraphAttn | kGraphMoeRouter).host_s, 20 * kUs, 1e-12);
  EXPECT_NEAR(host_launch_wait(b, 10 * kUs, kGraphAttn | kGraphMoeRouter).wait_s, 16 * kUs, 1e-12);
}

// Qwen3-30B-A3B on a DGX H100 (host section: Xeon, 13.5 us per call): the MoE forward syncs once
// on the dispatcher's preprocessing and ends with the wait; its backward has no sync; the
// topology without a host section (same machine, section removed) prices no wait.
TEST(HostLaunch, TheWorkloadCarriesTheWaitAsItsOwnPhase) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "dgx-h100");
  ParallelConfig c = test::config(8, 1, 8, 1, 8);
  c.recompute = Recompute::none;
  const Workload w = bench.workload(c);
  int syncs = 0;
  for (int i = 0; i < w.moe.forward.count; ++i) syncs += w.moe.forward.ops[i].host_sync ? 1 : 0;
  EXPECT_EQ(syncs, 1);
  for (int i = 0; i < w.moe.forward.count; ++i)
    EXPECT_EQ(w.moe.forward.ops[i].host_resume_calls, w.moe.forward.ops[i].host_sync ? kResumeAfterSyncCalls : 0.0);
  for (int i = 0; i < w.moe.backward.count; ++i) EXPECT_FALSE(w.moe.backward.ops[i].host_sync);
  EXPECT_EQ(test::op_seconds(w.moe.backward, "moe_preprocess"), 0.0);  // no backward twin
  const double wait = test::op_seconds(w.moe.forward, "host_launch_wait");
  EXPECT_GE(wait, kResumeAfterSyncCalls * 13.5e-6);  // at least the code after the sync, exposed
  EXPECT_NEAR(w.moe.forward.phase_seconds[int(Phase::host_launch)], wait, 1e-15);

  TopologySpec no_host = bench.topo;
  no_host.host = HostSpec{};
  const AnalyticProfile profile(no_host);
  const Evaluator evaluator(bench.m, no_host, profile);
  const Workload free = build_workload(bench.m, c, profile, evaluator.spans_for(c));
  EXPECT_EQ(test::op_seconds(free.moe.forward, "host_launch_wait"), 0.0);
  EXPECT_NEAR(w.moe.forward.seconds - wait, free.moe.forward.seconds, 1e-12);

  // Graphing the router and the preprocessing can only shorten the wait (here their calls fall
  // where the host is ahead anyway: no change).
  c.cuda_graph_scopes = kGraphMoeRouter | kGraphMoePreprocess;
  EXPECT_LE(test::op_seconds(bench.workload(c).moe.forward, "host_launch_wait"), wait);
}

// The iteration's exposed phases still sum to its time with the host's wait among them.
TEST(HostLaunch, ExposedPhasesSumWithTheHostsWait) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "gb200-nvl72");
  ParallelConfig c = test::config(8, 1, 8, 4, 64);
  c.recompute = Recompute::none;
  const SimResult r = simulate_iteration(bench.m, c, bench.workload(c));
  double sum = 0;
  for (double p : r.exposed) sum += p;
  EXPECT_NEAR(sum, r.iteration_s, 1e-9 * r.iteration_s);
  EXPECT_GT(r.exposed[int(Phase::host_launch)], 0.0);
}

TEST(HostLaunch, GraphScopesParseAndPrint) {
  EXPECT_EQ(parse_cuda_graph_scopes("none"), 0);
  EXPECT_EQ(parse_cuda_graph_scopes("attn,moe_router"), kGraphAttn | kGraphMoeRouter);
  EXPECT_EQ(cuda_graph_scopes_text(kGraphAttn | kGraphMoePreprocess), "attn,moe_preprocess");
  EXPECT_EQ(cuda_graph_scopes_text(0), "none");
  EXPECT_EQ(parse_cuda_graph_scopes("full_iteration"), kGraphFullIteration);
  EXPECT_EQ(cuda_graph_scopes_text(kGraphFullIteration), "full_iteration");
  EXPECT_THROW(parse_cuda_graph_scopes("full_iteration,attn"), InputError);  // it stands alone
  EXPECT_THROW(parse_cuda_graph_scopes("full"), InputError);
  EXPECT_THROW(parse_cuda_graph_scopes(""), InputError);
}

}  // namespace
}  // namespace tedsim
