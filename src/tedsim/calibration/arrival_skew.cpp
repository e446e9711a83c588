#include "tedsim/calibration/arrival_skew.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

namespace tedsim::calibration {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Every rank's `mine` (same length everywhere), rank after rank, on every rank.
std::vector<double> gather_all(Communicator& world, const std::vector<double>& mine) {
  const std::size_t n = mine.size();
  std::vector<double> all(n * std::size_t(world.size()), -std::numeric_limits<double>::max());
  std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(n * std::size_t(world.rank())));
  world.host_max(all);
  return all;
}

}  // namespace

SkewPoint measure_arrival_skew(Communicator& world, Communicator& group, Bench& bench, const Prepared& gemm,
                               double gemm_s, const SkewCaseSpec& c, int reps) {
  // The same count on every rank (gemm_s is the slowest rank's): ranks differ only by chance.
  const int gemms = std::max(3, int(std::lround(c.compute_s / std::max(gemm_s, 1e-9))));
  const double segment_s = std::max(c.compute_s, 3 * gemm_s);
  const int n = std::max(5, std::min(reps, int(std::ceil(0.5 / segment_s))));
  std::unique_ptr<CommBuffer> buf = group.make_buffer(sizeof(float));
  const float one = 1.0f;
  buf->upload(&one, sizeof one);
  const auto meet = [&] {
    group.all_reduce(buf->data(), buf->data(), 1, Dtype::fp32);
    group.wait();
  };
  std::vector<double> mine;  // compute then wait, per repetition
  mine.reserve(std::size_t(2 * n));
  meet();
  world.barrier();
  for (int i = 0; i < n; ++i) {
    const double t0 = now_s();
    (void)bench.time(gemm, 0, gemms, std::numeric_limits<double>::max());
    const double t1 = now_s();
    meet();
    const double t2 = now_s();
    meet();  // starts lined up: the transfer alone
    const double t3 = now_s();
    mine.push_back(t1 - t0);
    mine.push_back(std::max(0.0, (t2 - t1) - (t3 - t2)));
  }
  const std::vector<double> all = gather_all(world, mine);
  const int ranks = world.size();
  SkewPoint p;
  p.span = c.span;
  std::vector<double> waits, rep_means(std::size_t(n), 0.0);
  double compute = 0;
  for (int r = 0; r < ranks; ++r)
    for (int i = 0; i < n; ++i) {
      const double w = all[std::size_t(r) * std::size_t(2 * n) + std::size_t(2 * i + 1)];
      compute += all[std::size_t(r) * std::size_t(2 * n) + std::size_t(2 * i)];
      waits.push_back(w);
      rep_means[std::size_t(i)] += w / ranks;
    }
  const double samples = double(waits.size());
  p.samples = int(waits.size());
  p.compute_s = compute / samples;
  for (double w : waits) p.wait_mean_s += w / samples;
  std::sort(waits.begin(), waits.end());
  p.wait_p90_s = waits[std::min(waits.size() - 1, std::size_t(0.9 * samples))];
  p.wait_min_s = *std::min_element(rep_means.begin(), rep_means.end());
  p.wait_max_s = *std::max_element(rep_means.begin(), rep_means.end());
  return p;
}

}  // namespace tedsim::calibration
