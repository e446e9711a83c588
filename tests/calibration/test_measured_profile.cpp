// Measured profile: file format (round trip, strictness) and lookups (interpolation,
// extrapolation with warnings, reproduction of an analytic profile sampled at a few points).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>
#include <fstream>

#include "tedsim/core/error.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/profile/collective_table.hpp"
#include "tedsim/profile/far_masked_profile.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/search/evaluator.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/parallel_config.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim {
namespace {

TopologySpec local_cpu() { return load_topology(std::string(TEDSIM_SOURCE_DIR) + "/topologies/local-cpu.yaml"); }
ModelSpec tiny_moe() { return load_model(std::string(TEDSIM_SOURCE_DIR) + "/models/tiny-moe.yaml"); }

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "tedsim_calib_" + name; }

Timing timing(double median) { return Timing{median * 0.9, median, median * 1.25}; }

ProfileData sample_data() {
  ProfileData d;
  d.provenance.hosts = {"node-a", "node-b"};
  d.provenance.devices = {"Test CPU"};
  d.provenance.mpi = "Open MPI v4.1";
  d.provenance.cpu_model = "Test CPU";
  d.provenance.date = "2024-01-02T03:04:05Z";
  d.provenance.tedsim_version = "0.1.0";
  d.provenance.build_flags = "Release";
  d.provenance.backend = "cpu";
  d.provenance.ranks = 4;
  d.provenance.ranks_per_node = 2;
  d.gemms.push_back({GemmShape{64, 256, 128, 1, Dtype::fp32}, Timing{1.0 / 3.0 * 1e-5, 0.1 + 0.2, M_PI}});
  d.kernels.push_back({KernelKind::layernorm, Dtype::fp32, 65536, Timing{1e-7 * M_E, 2e-7 * M_PI, 1e-6 / 7}});
  d.kernels.back().seconds.max_s = 1.0;  // keep min <= median <= max
  CollectivePoint c;
  c.op = CollectiveOp::all_to_all;
  c.span = GroupSpan{4, 2, 2, 1, false};
  c.bytes = 1048576;
  c.seconds = Timing{1.1e-4, 1.2345678901234567e-4, 9.87654321e-4};
  c.busbw_gbs = 6.4321987654321;
  d.collectives.push_back(c);
  return d;
}

TEST(MeasuredProfileFile, RoundTripIsBitExactAndKeepsProvenance) {
  const ProfileData d = sample_data();
  const std::string path = temp_path("roundtrip.json");
  save_profile(path, d);
  const ProfileData r = load_profile_data(path);
  EXPECT_EQ(r.provenance.hosts, d.provenance.hosts);
  EXPECT_EQ(r.provenance.devices, d.provenance.devices);
  EXPECT_EQ(r.provenance.mpi, d.provenance.mpi);
  EXPECT_EQ(r.provenance.date, d.provenance.date);
  EXPECT_EQ(r.provenance.ranks, 4);
  EXPECT_EQ(r.provenance.ranks_per_node, 2);
  ASSERT_EQ(r.gemms.size(), 1u);
  EXPECT_EQ(r.gemms[0].shape.m, 64);
  EXPECT_EQ(r.gemms[0].seconds.min_s, d.gemms[0].seconds.min_s);  // bit-exact
  EXPECT_EQ(r.gemms[0].seconds.median_s, d.gemms[0].seconds.median_s);
  EXPECT_EQ(r.gemms[0].seconds.max_s, d.gemms[0].seconds.max_s);
  ASSERT_EQ(r.kernels.size(), 1u);
  EXPECT_EQ(r.kernels[0].seconds.min_s, d.kernels[0].seconds.min_s);
  EXPECT_EQ(r.kernels[0].seconds.median_s, d.kernels[0].seconds.median_s);
  ASSERT_EQ(r.collectives.size(), 1u);
  EXPECT_EQ(r.collectives[0].seconds.median_s, d.collectives[0].seconds.median_s);
  EXPECT_EQ(r.collectives[0].busbw_gbs, d.collectives[0].busbw_gbs);
  EXPECT_EQ(r.collectives[0].span.nodes, 2);
  EXPECT_EQ(profile_to_json(r), profile_to_json(d));
  std::remove(path.c_str());
}

void expect_rejected(const std::string& text, const std::string& must_contain) {
  try {
    profile_from_json(text, "bad.json");
    FAIL() << "accepted: " << text;
  } catch (const InputError& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(must_contain), std::string::npos) << e.what();
  }
}

TEST(MeasuredProfileFile, UnknownKeysAreRejectedWithFileAndKey) {
  std::string good = profile_to_json(sample_data());
  EXPECT_NO_THROW(profile_from_json(good, "good.json"));
  std::string bad = good;
  bad.replace(bad.find("\"m\":"), 4, "\"mm\": 1, \"m\":");
  expect_rejected(bad, "gemm[0].mm");
  bad = good;
  bad.replace(bad.find("\"provenance\":"), 13, "\"extra\": 1, \"provenance\":");
  expect_rejected(bad, "'extra'");
  bad = good;
  bad.replace(bad.find("\"hosts\":"), 8, "\"hostz\": [], \"hosts\":");
  expect_rejected(bad, "provenance.hostz");
  bad = good;
  bad.replace(bad.find("\"op\": \"all_to_all\""), 18, "\"op\": \"all_to_some\"");
  expect_rejected(bad, "collectives[0].op");
  bad = good;
  bad.replace(bad.find("\"m\":"), 4, "\"grouped\": 1, \"m\":");
  expect_rejected(bad, "gemm[0].grouped");
  expect_rejected("{ not json", "not valid JSON");
}

ProfileData alpha_beta_collectives(double alpha, double bw, const GroupSpan& span, CollectiveOp op) {
  ProfileData d = sample_data();
  d.collectives.clear();
  for (double b = 1024; b <= 1048576; b *= 4) {
    CollectivePoint c;
    c.op = op;
    c.span = span;
    c.bytes = b;
    c.seconds = timing(alpha + b / bw);
    d.collectives.push_back(c);
  }
  return d;
}

TEST(MeasuredProfileLookup, BetweenTwoSizesIsLogLogInterpolated) {
  ProfileData d = sample_data();
  d.kernels = {{KernelKind::gating, Dtype::fp32, 1 << 20, timing(1e-4)}, {KernelKind::gating, Dtype::fp32, 4 << 20, timing(9e-4)}};
  const MeasuredProfile p(d, local_cpu());
  const double mid = p.kernel_seconds(KernelKind::gating, 2 << 20, Dtype::fp32);
  EXPECT_GT(mid, 1e-4);
  EXPECT_LT(mid, 9e-4);
  EXPECT_NEAR(mid, 3e-4, 1e-12);  // halfway in log bytes: geometric mean of the times
  EXPECT_EQ(p.kernel_seconds(KernelKind::gating, 1 << 20, Dtype::fp32), 1e-4);  // measured point
  EXPECT_TRUE(p.warnings().empty());

  const GroupSpan span{4, 1, 4, 1, false};
  const MeasuredProfile c(alpha_beta_collectives(5e-6, 2e9, span, CollectiveOp::all_reduce), local_cpu());
  const double lo = c.collective_seconds(CollectiveOp::all_reduce, span, 16384);
  const double hi = c.collective_seconds(CollectiveOp::all_reduce, span, 65536);
  const double between = c.collective_seconds(CollectiveOp::all_reduce, span, 32768);
  EXPECT_GT(between, lo);
  EXPECT_LT(between, hi);
  EXPECT_NEAR(between, std::sqrt(lo * hi), 1e-15);
  EXPECT_TRUE(c.warnings().empty());
}

// A profile at either end of the spread answers each measured point with its fastest or slowest
// repetition, and the interpolation between points follows.
TEST(MeasuredProfileLookup, SpreadEndsAnswerWithTheFastestAndSlowestRepetitions) {
  ProfileData d = sample_data();
  d.kernels = {{KernelKind::gating, Dtype::fp32, 1 << 20, timing(1e-4)}, {KernelKind::gating, Dtype::fp32, 4 << 20, timing(9e-4)}};
  const MeasuredProfile median(d, local_cpu());
  const MeasuredProfile fastest(at_spread_end(d, SpreadEnd::fastest), local_cpu());
  const MeasuredProfile slowest(at_spread_end(d, SpreadEnd::slowest), local_cpu());
  EXPECT_DOUBLE_EQ(fastest.kernel_seconds(KernelKind::gating, 1 << 20, Dtype::fp32), 0.9e-4);
  EXPECT_DOUBLE_EQ(slowest.kernel_seconds(KernelKind::gating, 1 << 20, Dtype::fp32), 1.25e-4);
  const double mid = median.kernel_seconds(KernelKind::gating, 2 << 20, Dtype::fp32);
  EXPECT_NEAR(fastest.kernel_seconds(KernelKind::gating, 2 << 20, Dtype::fp32), 0.9 * mid, 1e-12);
  EXPECT_NEAR(slowest.kernel_seconds(KernelKind::gating, 2 << 20, Dtype::fp32), 1.25 * mid, 1e-12);
  const GemmShape g = d.gemms.front().shape;
  EXPECT_DOUBLE_EQ(fastest.gemm_seconds(g), d.gemms.front().seconds.min_s);
  EXPECT_DOUBLE_EQ(slowest.gemm_seconds(g), d.gemms.front().seconds.max_s);
  const CollectivePoint& c = d.collectives.front();
  EXPECT_DOUBLE_EQ(fastest.collective_seconds(c.op, c.span, c.bytes), c.seconds.min_s);
  EXPECT_DOUBLE_EQ(slowest.collective_seconds(c.op, c.span, c.bytes), c.seconds.max_s);
}

TEST(MeasuredProfileLookup, BeyondTheRangeUsesAnAlphaBetaFitAndWarns) {
  const GroupSpan span{4, 2, 2, 1, false};
  const double alpha = 20e-6, bw = 1.5e9;
  const MeasuredProfile p(alpha_beta_collectives(alpha, bw, span, CollectiveOp::all_to_all), local_cpu());
  const double big = 256.0 * 1048576;
  EXPECT_NEAR(p.collective_seconds(CollectiveOp::all_to_all, span, big), alpha + big / bw, 1e-3 * (alpha + big / bw));
  EXPECT_NEAR(p.collective_seconds(CollectiveOp::all_to_all, span, 100), alpha + 100 / bw, 0.02 * alpha);
  const auto w = p.warnings();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("above the measured"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("alpha-beta"), std::string::npos) << w[0];
  EXPECT_NE(w[1].find("below the measured"), std::string::npos) << w[1];
  // Asked again (and at other sizes beyond the range): still one line per kind of extrapolation.
  p.collective_seconds(CollectiveOp::all_to_all, span, 2 * big);
  p.collective_seconds(CollectiveOp::all_to_all, span, big);
  EXPECT_EQ(p.warnings().size(), 2u);
}

// Lookups more than 4x outside the measured sizes are "far": flagged per lookup, marked in the
// warnings, and answered as free by FarMaskedProfile (so a prediction's share on them can be had).
TEST(MeasuredProfileLookup, FarExtrapolationsAreFlaggedAndMaskable) {
  const GroupSpan span{4, 1, 4, 1, false};
  const MeasuredProfile p(alpha_beta_collectives(5e-6, 2e9, span, CollectiveOp::all_reduce), local_cpu());
  const double top = 1048576;  // the largest measured size; the smallest is 1 KiB
  EXPECT_FALSE(p.far_outside(CollectiveOp::all_reduce, span, top / 2));      // measured range
  EXPECT_FALSE(p.far_outside(CollectiveOp::all_reduce, span, 3.9 * top));    // beyond, but near
  EXPECT_TRUE(p.far_outside(CollectiveOp::all_reduce, span, 4.1 * top));     // far above
  EXPECT_TRUE(p.far_outside(CollectiveOp::all_reduce, span, 1024 / 4.1));    // far below
  const auto w = p.warnings();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].rfind("far: ", 0), 0u) << w[0];  // above: one of its lookups was far
  EXPECT_EQ(w[1].rfind("far: ", 0), 0u) << w[1];

  const MeasuredProfile near_only(alpha_beta_collectives(5e-6, 2e9, span, CollectiveOp::all_reduce), local_cpu());
  near_only.collective_seconds(CollectiveOp::all_reduce, span, 2 * top);
  ASSERT_EQ(near_only.warnings().size(), 1u);
  EXPECT_EQ(near_only.warnings()[0].find("far: "), std::string::npos) << near_only.warnings()[0];

  const FarMaskedProfile masked(p);
  EXPECT_EQ(masked.collective_seconds(CollectiveOp::all_reduce, span, 8 * top), 0.0);
  EXPECT_EQ(masked.collective_seconds(CollectiveOp::all_reduce, span, top / 2),
            p.collective_seconds(CollectiveOp::all_reduce, span, top / 2));
  EXPECT_GT(masked.collective_seconds(CollectiveOp::all_reduce, span, 3 * top), 0.0);

  ProfileData k = sample_data();
  k.kernels = {{KernelKind::gating, Dtype::fp32, 1 << 20, timing(1e-4)}, {KernelKind::gating, Dtype::fp32, 4 << 20, timing(4e-4)}};
  const MeasuredProfile kp(k, local_cpu());
  EXPECT_FALSE(kp.far_outside(KernelKind::gating, 8 << 20, Dtype::fp32));
  EXPECT_TRUE(kp.far_outside(KernelKind::gating, 32 << 20, Dtype::fp32));
  EXPECT_EQ(FarMaskedProfile(kp).kernel_seconds(KernelKind::gating, 32 << 20, Dtype::fp32), 0.0);
}

// GEMMs outside the measured shapes (a quick calibration of a small model, asked about a larger
// one): the local fit may extrapolate, but never past the efficiency (FLOP/s) of the measured
// neighbours, and the warning quotes that efficiency. An analytic profile sampled on a small grid
// stands in for the calibration; its efficiency only grows with size, so above the grid the answer
// is bounded by the best measured rate, below it by the worst.
TEST(MeasuredProfileLookup, GemmsBeyondTheMeasuredShapesKeepTheNeighboursEfficiency) {
  const TopologySpec topo = local_cpu();
  const AnalyticProfile a(topo);
  ProfileData d = sample_data();
  d.gemms.clear();
  double eff_min = 1e300, eff_max = 0;
  for (std::int64_t m = 16; m <= 128; m *= 2)
    for (std::int64_t n = 16; n <= 128; n *= 2)
      for (std::int64_t k = 16; k <= 128; k *= 2) {
        const GemmShape s{m, n, k, 1, Dtype::fp32};
        const double t = a.gemm_seconds(s);
        d.gemms.push_back({s, timing(t)});
        eff_min = std::min(eff_min, s.flops() / t);
        eff_max = std::max(eff_max, s.flops() / t);
      }
  const MeasuredProfile p(d, topo);
  for (const GemmShape& s : {GemmShape{512, 512, 512, 1, Dtype::fp32}, GemmShape{2048, 2048, 512, 1, Dtype::fp32},
                             GemmShape{4, 4, 4, 1, Dtype::fp32}, GemmShape{2, 8, 16, 1, Dtype::fp32}}) {
    const double eff = s.flops() / p.gemm_seconds(s);
    EXPECT_LE(eff, eff_max * (1 + 1e-9)) << s.m << "x" << s.n << "x" << s.k;
    EXPECT_GE(eff, eff_min * (1 - 1e-9)) << s.m << "x" << s.n << "x" << s.k;
  }
  // Above the grid the analytic rate keeps rising, so the bound is the best measured rate.
  const GemmShape big{2048, 2048, 512, 1, Dtype::fp32};
  EXPECT_NEAR(big.flops() / p.gemm_seconds(big), eff_max, 0.05 * eff_max);
  const auto w = p.warnings();
  ASSERT_EQ(w.size(), 2u);  // one above, one below
  const std::string& above = w[0].find("above") != std::string::npos ? w[0] : w[1];
  EXPECT_NE(above.find("extrapolated"), std::string::npos) << above;
  // The quoted rate is the one used: "(<x> GFLOP/s)", within the measured range.
  const auto open = above.rfind('('), unit = above.find(" GFLOP/s");
  ASSERT_NE(open, std::string::npos);
  ASSERT_NE(unit, std::string::npos);
  const double quoted = std::stod(above.substr(open + 1, unit - open - 1)) * 1e9;
  EXPECT_LE(quoted, eff_max * 1.01) << above;
  EXPECT_GE(quoted, eff_min * 0.99) << above;
}

// A grouped GEMM (the local experts, each with its own weights) and a batched one of the same
// dimensions (the attention core's products) are timed apart: calibration finds the experts'
// operands out of cache and the batched ones in it. Each kind is looked up on its own points; a
// profile that has points of one kind only serves both from them.
TEST(MeasuredProfileLookup, GroupedGemmsAnswerFromTheirOwnPoints) {
  const TopologySpec topo = local_cpu();
  ProfileData d = sample_data();
  d.gemms.clear();
  for (std::int64_t m : {32, 64, 128})
    for (bool grouped : {false, true}) {
      const GemmShape s{m, 128, 256, 16, Dtype::fp32, grouped};
      d.gemms.push_back({s, timing(s.flops() / (grouped ? 30e9 : 40e9))});  // grouped: 30 GFLOP/s, batched: 40
    }
  const std::string path = temp_path("grouped.json");
  save_profile(path, d);
  const ProfileData r = load_profile_data(path);
  std::remove(path.c_str());
  ASSERT_EQ(r.gemms.size(), 6u);
  EXPECT_FALSE(r.gemms[0].shape.grouped);
  EXPECT_TRUE(r.gemms[1].shape.grouped);
  EXPECT_NE(profile_to_json(r).find("\"grouped\": true"), std::string::npos);
  const MeasuredProfile p(r, topo);
  const GemmShape batched{90, 128, 256, 16, Dtype::fp32, false}, grouped{90, 128, 256, 16, Dtype::fp32, true};
  EXPECT_NEAR(batched.flops() / p.gemm_seconds(batched), 40e9, 40e9 * 1e-6);
  EXPECT_NEAR(grouped.flops() / p.gemm_seconds(grouped), 30e9, 30e9 * 1e-6);
  // A profile of batched points only (written before grouped GEMMs were timed apart).
  ProfileData old = r;
  old.gemms.erase(std::remove_if(old.gemms.begin(), old.gemms.end(), [](const GemmPoint& g) { return g.shape.grouped; }),
                  old.gemms.end());
  const MeasuredProfile q(old, topo);
  EXPECT_NEAR(grouped.flops() / q.gemm_seconds(grouped), 40e9, 40e9 * 1e-6);
}

ProfileData gating_points(const std::vector<std::pair<double, double>>& bytes_seconds) {
  ProfileData d = sample_data();
  d.kernels.clear();
  for (const auto& [b, t] : bytes_seconds) d.kernels.push_back({KernelKind::gating, Dtype::fp32, b, timing(t)});
  return d;
}

// Every point latency-bound (times drifting slightly down with size: a quick calibration) gives a
// flat fit with no bandwidth. Above the range the time must still grow with size: linearly from
// the largest point, at its rate, not a constant latency for a GiB.
TEST(MeasuredProfileLookup, FlatFitStillGrowsAboveTheRange) {
  const MeasuredProfile p(gating_points({{1024, 10e-6}, {4096, 9.95e-6}, {16384, 9.9e-6}}), local_cpu());
  const double gib = 1024.0 * 1048576;
  EXPECT_NEAR(p.kernel_seconds(KernelKind::gating, gib, Dtype::fp32), 9.9e-6 * gib / 16384, 1e-9);
  EXPECT_NEAR(p.kernel_seconds(KernelKind::gating, 16 * gib, Dtype::fp32),
              16 * p.kernel_seconds(KernelKind::gating, gib, Dtype::fp32), 1e-9);
  // Below the range a flat series stays at its latency.
  EXPECT_NEAR(p.kernel_seconds(KernelKind::gating, 64, Dtype::fp32), 9.95e-6, 0.01e-6);
  const auto w = p.warnings();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("flat alpha-beta fit of 3 points"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("[asked 1 GiB..16 GiB, 2 distinct lookups]"), std::string::npos) << w[0];
}

// The fit minimizes relative error, so it can pass below the last point: just above the range
// the time must not drop below the largest measured time, and must keep growing.
TEST(MeasuredProfileLookup, NeverFasterThanTheLargestPointAboveTheRange) {
  const MeasuredProfile p(gating_points({{1024, 10e-6}, {4096, 10e-6}, {16384, 10e-6}, {65536, 10e-6},
                                         {262144, 20e-6}, {1048576, 80e-6}}),
                          local_cpu());
  const double at = p.kernel_seconds(KernelKind::gating, 1048576, Dtype::fp32);
  const double just_above = p.kernel_seconds(KernelKind::gating, 1.01 * 1048576, Dtype::fp32);
  const double twice = p.kernel_seconds(KernelKind::gating, 2.0 * 1048576, Dtype::fp32);
  EXPECT_EQ(at, 80e-6);
  EXPECT_GE(just_above, at);
  EXPECT_GT(twice, just_above);
}

// The fit minimizes relative error, so it can also pass below the smallest point (here a slow
// first point): just below the range the time must not drop under the smallest point's rate
// (bytes/s), nor rise above its time.
TEST(MeasuredProfileLookup, NeverAboveTheSmallestPointsRateBelowTheRange) {
  const MeasuredProfile p(gating_points({{1024, 20e-6}, {4096, 10e-6}, {16384, 12e-6}, {65536, 20e-6}}), local_cpu());
  const double just_below = p.kernel_seconds(KernelKind::gating, 1000, Dtype::fp32);
  EXPECT_GE(just_below, 20e-6 * 1000 / 1024 * (1 - 1e-12));
  EXPECT_LE(just_below, 20e-6);
  EXPECT_LE(p.kernel_seconds(KernelKind::gating, 16, Dtype::fp32), just_below);
}

// Sizes measured more than once (merged profiles) answer with the median of their times.
TEST(MeasuredProfileLookup, RepeatedSizesUseTheirMedian) {
  const MeasuredProfile p(gating_points({{1024, 1e-6}, {1024, 100e-6}, {1024, 2e-6}, {4096, 8e-6}}), local_cpu());
  EXPECT_EQ(p.kernel_seconds(KernelKind::gating, 1024, Dtype::fp32), 2e-6);
}

// The GEMM extrapolation warning quotes the range of FLOP/s the answers used, not the first one.
TEST(MeasuredProfileLookup, GemmWarningQuotesTheRatesUsed) {
  ProfileData d = sample_data();
  d.gemms.clear();
  for (std::int64_t m : {16, 32, 64})
    for (std::int64_t n : {16, 32, 64})
      for (std::int64_t k : {16, 32, 64}) {
        const GemmShape s{m, n, k, 1, Dtype::fp32};
        d.gemms.push_back({s, timing(s.flops() / (1e9 * k / 16))});  // 1..4 GFLOP/s, rising with k
      }
  const MeasuredProfile p(d, local_cpu());
  const GemmShape a{4096, 64, 16, 1, Dtype::fp32}, b{64, 64, 4096, 1, Dtype::fp32};
  const double ea = a.flops() / p.gemm_seconds(a) / 1e9, eb = b.flops() / p.gemm_seconds(b) / 1e9;
  EXPECT_LT(ea, eb);
  const auto w = p.warnings();
  ASSERT_EQ(w.size(), 1u);
  char expect[64];
  std::snprintf(expect, sizeof expect, "(%.3g..%.3g GFLOP/s)", ea, eb);
  EXPECT_NE(w[0].find(expect), std::string::npos) << w[0] << " lacks " << expect;
}

// A borrowed group shape that is also asked beyond its range: the warning quotes the fit as used,
// i.e. scaled by the bus-bandwidth factor ratio.
TEST(MeasuredProfileLookup, BorrowedShapeWarningQuotesTheScaledFit) {
  const GroupSpan measured{2, 1, 2, 1, false}, asked{8, 1, 8, 1, false};
  const MeasuredProfile p(alpha_beta_collectives(5e-6, 2e9, measured, CollectiveOp::all_reduce), local_cpu());
  const double big = 256.0 * 1048576;
  const double scale = bus_bandwidth_factor(CollectiveOp::all_reduce, 8) / bus_bandwidth_factor(CollectiveOp::all_reduce, 2);
  EXPECT_NEAR(p.collective_seconds(CollectiveOp::all_reduce, asked, big), (5e-6 + big / 2e9) * scale,
              1e-3 * (5e-6 + big / 2e9) * scale);
  bool found = false;
  char algbw[32];
  std::snprintf(algbw, sizeof algbw, "%.3g GB/s algbw", 2.0 / scale);
  for (const std::string& line : p.warnings()) found = found || line.find(algbw) != std::string::npos;
  EXPECT_TRUE(found) << "no warning quotes " << algbw << "; first: " << p.warnings().front();
}

TEST(MeasuredProfileLookup, UnmeasuredGroupShapeScalesByBusBandwidthFactor) {
  const GroupSpan measured{2, 1, 2, 1, false}, asked{4, 1, 4, 1, false};
  const MeasuredProfile p(alpha_beta_collectives(5e-6, 2e9, measured, CollectiveOp::all_reduce), local_cpu());
  const double base = p.collective_seconds(CollectiveOp::all_reduce, measured, 65536);
  const double scaled = p.collective_seconds(CollectiveOp::all_reduce, asked, 65536);
  EXPECT_NEAR(scaled / base, bus_bandwidth_factor(CollectiveOp::all_reduce, 4) / bus_bandwidth_factor(CollectiveOp::all_reduce, 2), 1e-12);
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_NE(p.warnings()[0].find("never measured"), std::string::npos);
  // An op never measured at all: the analytic fallback answers, and says so.
  const AnalyticProfile analytic(local_cpu());
  EXPECT_EQ(p.collective_seconds(CollectiveOp::all_gather, asked, 65536),
            analytic.collective_seconds(CollectiveOp::all_gather, asked, 65536));
  EXPECT_EQ(p.warnings().size(), 2u);
}

// The pipeline's p2p is the send_recv collective as calibrated on the pipeline groups; a profile
// without it says so once and answers from the topology.
TEST(MeasuredProfileLookup, PipelineP2pAnswersFromTheMeasuredSendRecv) {
  const GroupSpan pair{2, 1, 2, 1, false};
  const MeasuredProfile p(alpha_beta_collectives(5e-6, 2e9, pair, CollectiveOp::send_recv), local_cpu());
  EXPECT_NEAR(p.p2p_seconds(pair, 65536), 5e-6 + 65536 / 2e9, 1e-9);
  EXPECT_EQ(p.p2p_seconds(pair, 65536), p.collective_seconds(CollectiveOp::send_recv, pair, 65536));
  EXPECT_TRUE(p.warnings().empty());
  const MeasuredProfile without(alpha_beta_collectives(5e-6, 2e9, pair, CollectiveOp::all_reduce), local_cpu());
  const AnalyticProfile analytic(local_cpu());
  EXPECT_EQ(without.p2p_seconds(pair, 65536), analytic.p2p_seconds(pair, 65536));
  (void)without.p2p_seconds(pair, 1 << 20);
  ASSERT_EQ(without.warnings().size(), 1u);
  EXPECT_NE(without.warnings()[0].find("p2p inside a node: not in this profile"), std::string::npos);
}

// Dropless's all-to-all-v answers from its own points; a profile without any (calibrated before
// tedsim measured it, or for a model that is not dropless) answers from the even all-to-all of the
// same size, and says so once.
TEST(MeasuredProfileLookup, AllToAllVFromItsOwnPointsElseTheEvenOne) {
  const GroupSpan pair{2, 1, 2, 1, false};
  ProfileData both = alpha_beta_collectives(5e-6, 2e9, pair, CollectiveOp::all_to_all);
  const ProfileData v = alpha_beta_collectives(9e-6, 1e9, pair, CollectiveOp::all_to_all_v);
  both.collectives.insert(both.collectives.end(), v.collectives.begin(), v.collectives.end());
  const MeasuredProfile p(both, local_cpu());
  EXPECT_NEAR(p.collective_seconds(CollectiveOp::all_to_all_v, pair, 65536), 9e-6 + 65536 / 1e9, 1e-9);
  EXPECT_NEAR(p.collective_seconds(CollectiveOp::all_to_all, pair, 65536), 5e-6 + 65536 / 2e9, 1e-9);
  EXPECT_TRUE(p.warnings().empty());
  const MeasuredProfile even_only(alpha_beta_collectives(5e-6, 2e9, pair, CollectiveOp::all_to_all), local_cpu());
  EXPECT_EQ(even_only.collective_seconds(CollectiveOp::all_to_all_v, pair, 65536),
            even_only.collective_seconds(CollectiveOp::all_to_all, pair, 65536));
  (void)even_only.collective_seconds(CollectiveOp::all_to_all_v, pair, 1 << 20);
  ASSERT_EQ(even_only.warnings().size(), 1u);
  EXPECT_NE(even_only.warnings()[0].find("all_to_all_v: not in this profile"), std::string::npos);
}

TEST(MeasuredProfileFile, AllToAllVKeepsItsSplitAndChecksIt) {
  ProfileData d = sample_data();
  CollectivePoint c = d.collectives[0];
  c.op = CollectiveOp::all_to_all_v;
  c.busiest_load = 1.25;
  d.collectives.push_back(c);
  const std::string path = temp_path("a2av.json");
  save_profile(path, d);
  const ProfileData r = load_profile_data(path);
  ASSERT_EQ(r.collectives.size(), 2u);
  EXPECT_EQ(r.collectives[1].op, CollectiveOp::all_to_all_v);
  EXPECT_EQ(r.collectives[1].busiest_load, 1.25);
  // A split beyond the group's 4 ranks, and a split on an op that has none, are both errors.
  const std::string good = profile_to_json(d);
  const std::size_t at = good.find("\"busiest_load\": 1.25");
  ASSERT_NE(at, std::string::npos) << good;
  std::string bad = good;
  bad.replace(at, 20, "\"busiest_load\": 9.00");
  expect_rejected(bad, "collectives[1].busiest_load");
  bad = good;
  bad.replace(bad.find("\"busbw_gbs\""), 11, "\"busiest_load\": 1.0, \"busbw_gbs\"");
  expect_rejected(bad, "collectives[0].busiest_load");
  std::remove(path.c_str());
}

// Samples an analytic profile at a few points per axis, as a calibration would.
ProfileData sample_analytic(const Profile& a) {
  ProfileData d = sample_data();
  d.gemms.clear();
  d.kernels.clear();
  d.collectives.clear();
  // GEMMs on a factor-2 grid (what the calibration's shape buckets give), batches included.
  for (std::int64_t batch : {1, 4, 16})
    for (std::int64_t m = 4; m <= 4096; m *= 2)
      for (std::int64_t n = 4; n <= 4096; n *= 2)
        for (std::int64_t k = 4; k <= 4096; k *= 2) {
          const GemmShape s{m, n, k, batch, Dtype::fp32};
          d.gemms.push_back({s, timing(a.gemm_seconds(s))});
        }
  for (int kind = 0; kind < int(KernelKind::count); ++kind)
    for (double b = 4096; b <= 1 << 28; b *= 4)
      d.kernels.push_back({KernelKind(kind), Dtype::fp32, b, timing(a.kernel_seconds(KernelKind(kind), b, Dtype::fp32))});
  const GroupSpan spans[] = {{2, 1, 2, 1, false}, {4, 2, 2, 1, false}};
  for (const GroupSpan& s : spans)
    for (int op = 0; op < int(CollectiveOp::count); ++op)
      for (double b = 1024; b <= 1 << 26; b *= 2) {  // the calibration default step factor
        CollectivePoint c;
        c.op = CollectiveOp(op);
        c.span = s;
        c.bytes = b;
        c.seconds = timing(a.collective_seconds(CollectiveOp(op), s, b));
        d.collectives.push_back(c);
      }
  return d;
}

TEST(MeasuredProfileLookup, ReproducesAnAnalyticProfileAtUnsampledSizes) {
  const TopologySpec topo = local_cpu();
  const AnalyticProfile a(topo);
  const MeasuredProfile p(sample_analytic(a), topo);
  for (int kind = 0; kind < int(KernelKind::count); ++kind)
    for (double b = 5000; b < 2e8; b *= 3.3) {
      const double want = a.kernel_seconds(KernelKind(kind), b, Dtype::fp32);
      EXPECT_NEAR(p.kernel_seconds(KernelKind(kind), b, Dtype::fp32), want, 0.03 * want) << to_string(KernelKind(kind)) << " " << b;
    }
  const GroupSpan spans[] = {{2, 1, 2, 1, false}, {4, 2, 2, 1, false}};
  for (const GroupSpan& s : spans)
    for (int op = 0; op < int(CollectiveOp::count); ++op)
      for (double b = 1500; b < 6e7; b *= 3.3) {
        const double want = a.collective_seconds(CollectiveOp(op), s, b);
        EXPECT_NEAR(p.collective_seconds(CollectiveOp(op), s, b), want, 0.03 * want) << to_string(CollectiveOp(op)) << " " << b;
      }
  for (std::int64_t m : {24, 100, 500, 2000})
    for (std::int64_t n : {100, 700, 3000})
      for (std::int64_t k : {80, 600, 2500}) {
        const GemmShape s{m, n, k, 1, Dtype::fp32};
        const double want = a.gemm_seconds(s);
        EXPECT_NEAR(p.gemm_seconds(s), want, 0.06 * want) /* kinks of the efficiency curves */ << m << "x" << n << "x" << k;
      }
  EXPECT_TRUE(p.warnings().empty()) << p.warnings().front();
}

TEST(MeasuredProfileLookup, EvaluatorOnSampledAnalyticMatchesAnalytic) {
  const TopologySpec topo = local_cpu();
  const ModelSpec model = tiny_moe();
  const AnalyticProfile a(topo);
  const MeasuredProfile p(sample_analytic(a), topo);
  ParallelConfig c;
  c.gpus = 4;
  c.tp = 2;
  c.ep = 2;
  c.global_batch = 16;
  c.micro_batch = 2;
  validate_config(c, model);
  const double want = Evaluator(model, topo, a).evaluate(c).sim.iteration_s;
  const double got = Evaluator(model, topo, p).evaluate(c).sim.iteration_s;
  EXPECT_NEAR(got, want, 0.05 * want);
}

// Arrival-skew points of one group shape: waits 5% of 2 ms, 4% of 32 ms.
ProfileData with_skew(ProfileData d) {
  SkewPoint a;
  a.span = GroupSpan{4, 2, 2, 1, false};
  a.compute_s = 2e-3;
  a.wait_mean_s = 1e-4;
  a.wait_p90_s = 3e-4;
  a.wait_min_s = 0.5e-4;
  a.wait_max_s = 2e-4;
  a.samples = 80;
  SkewPoint b = a;
  b.compute_s = 32e-3;
  b.wait_mean_s = 1.28e-3;
  b.wait_min_s = 1e-3;
  b.wait_max_s = 2e-3;
  d.skews = {a, b};
  return d;
}

TEST(MeasuredProfileFile, ArrivalSkewRoundTripsAndItsKeysAreChecked) {
  const ProfileData d = with_skew(sample_data());
  const ProfileData r = profile_from_json(profile_to_json(d), "skew.json");
  ASSERT_EQ(r.skews.size(), 2u);
  EXPECT_EQ(r.skews[1].compute_s, d.skews[1].compute_s);
  EXPECT_EQ(r.skews[1].wait_mean_s, d.skews[1].wait_mean_s);
  EXPECT_EQ(r.skews[0].wait_p90_s, d.skews[0].wait_p90_s);
  EXPECT_EQ(r.skews[0].samples, 80);
  EXPECT_EQ(r.skews[0].span.nodes, 2);
  EXPECT_EQ(profile_to_json(r), profile_to_json(d));
  std::string bad = profile_to_json(d);
  bad.replace(bad.find("\"compute_s\":"), 12, "\"computed_s\": 1, \"compute_s\":");
  expect_rejected(bad, "arrival_skew[0].computed_s");
  bad = profile_to_json(d);
  bad.replace(bad.find("\"p90\":"), 6, "\"p95\": 1, \"p90\":");
  expect_rejected(bad, "arrival_skew[0].wait_s.p95");
  bad = profile_to_json(d);
  bad.replace(bad.find("\"mean\":"), 7, "\"mean\": -1, \"unused\":");
  expect_rejected(bad, "arrival_skew[0].wait_s");
}

TEST(MeasuredProfileFile, ExpertSharesRoundTripAndAreChecked) {
  ProfileData d = sample_data();
  d.expert_shares.model = "cpu-moe-fine";
  d.expert_shares.rows_per_pass = 1024;
  d.expert_shares.passes = {{0.5, 0.25, 0.125, 0.125}, {0.25, 0.25, 0.25, 0.25}};
  const ProfileData r = profile_from_json(profile_to_json(d), "shares.json");
  EXPECT_EQ(r.expert_shares.model, "cpu-moe-fine");
  EXPECT_EQ(r.expert_shares.rows_per_pass, 1024);
  EXPECT_EQ(r.expert_shares.passes, d.expert_shares.passes);
  EXPECT_EQ(profile_to_json(r), profile_to_json(d));
  // A profile without them (a capacity-routed or dense model, an older profile) reads as none.
  EXPECT_TRUE(profile_from_json(profile_to_json(sample_data()), "none.json").expert_shares.empty());
  std::string bad = profile_to_json(d);
  bad.replace(bad.find("\"rows_per_pass\":"), 16, "\"rows\": 1, \"rows_per_pass\":");
  expect_rejected(bad, "expert_shares.rows");
  bad = profile_to_json(d);
  bad.replace(bad.find("0.125,"), 6, "0.625,");  // the first pass sums to 1.5
  expect_rejected(bad, "expert_shares.passes");
  ProfileData ragged = d;
  ragged.expert_shares.passes[1] = {0.5, 0.5};
  expect_rejected(profile_to_json(ragged), "pass 1: 2 shares for a model of 4 routed experts");
  ProfileData negative = d;
  negative.expert_shares.passes[1] = {1.25, -0.25, 0.0, 0.0};
  expect_rejected(profile_to_json(negative), "expected shares >= 0");
}

TEST(MeasuredProfileLookup, ArrivalWaitInterpolatesInTheComputeSegment) {
  const MeasuredProfile p(with_skew(sample_data()), local_cpu());
  const GroupSpan span{4, 2, 2, 1, false};
  EXPECT_DOUBLE_EQ(p.arrival_wait_seconds(span, 0), 0);           // lined up: no wait
  EXPECT_NEAR(p.arrival_wait_seconds(span, 1e-3), 0.5e-4, 1e-12);  // from (0, 0) to the first point
  EXPECT_NEAR(p.arrival_wait_seconds(span, 2e-3), 1e-4, 1e-12);
  EXPECT_NEAR(p.arrival_wait_seconds(span, 17e-3), 1e-4 + 0.5 * (1.28e-3 - 1e-4), 1e-12);
  EXPECT_TRUE(p.warnings().empty());
  // Above the longest segment, in proportion to it; far above, with a warning.
  EXPECT_NEAR(p.arrival_wait_seconds(span, 64e-3), 2.56e-3, 1e-12);
  EXPECT_TRUE(p.warnings().empty());
  EXPECT_NEAR(p.arrival_wait_seconds(span, 320e-3), 12.8e-3, 1e-12);
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_NE(p.warnings()[0].find("wait scaled in proportion"), std::string::npos) << p.warnings()[0];
  // One rank never waits for another.
  EXPECT_DOUBLE_EQ(p.arrival_wait_seconds(GroupSpan{1, 1, 1, 1, false}, 1.0), 0);
}

TEST(MeasuredProfileLookup, ArrivalWaitOfAnUnmeasuredShapeBorrowsTheNearestAndSays) {
  const MeasuredProfile p(with_skew(sample_data()), local_cpu());
  EXPECT_NEAR(p.arrival_wait_seconds(GroupSpan{8, 2, 4, 1, false}, 2e-3), 1e-4, 1e-12);
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_NE(p.warnings()[0].find("group shape never measured"), std::string::npos) << p.warnings()[0];
}

TEST(MeasuredProfileLookup, ArrivalWaitMissingFromAMultiRankProfileIsZeroAndSaid) {
  const MeasuredProfile p(sample_data(), local_cpu());
  EXPECT_DOUBLE_EQ(p.arrival_wait_seconds(GroupSpan{4, 2, 2, 1, false}, 5e-3), 0);
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_NE(p.warnings()[0].find("arrive together"), std::string::npos) << p.warnings()[0];
  EXPECT_DOUBLE_EQ(AnalyticProfile(local_cpu()).arrival_wait_seconds(GroupSpan{4, 2, 2, 1, false}, 5e-3), 0);
}

TEST(MeasuredProfileLookup, ArrivalWaitSpreadEndsUseTheRepetitionsExtremes) {
  const ProfileData d = with_skew(sample_data());
  const GroupSpan span{4, 2, 2, 1, false};
  EXPECT_NEAR(MeasuredProfile(at_spread_end(d, SpreadEnd::fastest), local_cpu()).arrival_wait_seconds(span, 32e-3), 1e-3, 1e-12);
  EXPECT_NEAR(MeasuredProfile(at_spread_end(d, SpreadEnd::slowest), local_cpu()).arrival_wait_seconds(span, 32e-3), 2e-3, 1e-12);
}

}  // namespace
}  // namespace tedsim
