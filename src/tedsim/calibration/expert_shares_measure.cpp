#include "tedsim/calibration/expert_shares_measure.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "tedsim/comm/mpi_communicator.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/runtime/trainer.hpp"
#include "tedsim/spec/parallel_config.hpp"

namespace tedsim::calibration {

ExpertShares measure_expert_shares(Communicator& world, const ModelSpec& model, int seq_len, int iterations) {
  ExpertShares shares;
  shares.model = model.name;
  if (!model.is_moe() || !model.moe.dropless() || iterations <= 0) return shares;
  // Data parallelism alone: every rank routes its own sequence through all the experts, so each
  // pass's counts are the router's choices before any exchange.
  ParallelConfig c;
  c.gpus = world.size();
  c.global_batch = world.size();
  c.micro_batch = 1;
  c.seq_len = seq_len;
  c.recompute = Recompute::none;
  c.zero = 1;
  validate_config(c, model);
  runtime::TrainerOptions options;
  options.track_routing = false;
  options.track_expert_loads = true;
  runtime::Trainer trainer(world, model, c, options);
  for (int i = 0; i < iterations; ++i) trainer.global_loss(i);
  const std::vector<std::vector<std::int32_t>>& mine = trainer.expert_load_samples();
  const std::size_t E = std::size_t(model.moe.experts), passes = mine.size(), n = std::size_t(world.size());
  // Every rank ran the same passes in the same order; the sum over ranks goes through host_max,
  // one slot per rank (the control plane works on host values whatever the backend).
  std::vector<double> slots(n * passes * E, -1.0);
  for (std::size_t p = 0; p < passes; ++p)
    for (std::size_t e = 0; e < E; ++e)
      slots[(std::size_t(world.rank()) * passes + p) * E + e] = e < mine[p].size() ? double(mine[p][e]) : 0.0;
  world.host_max(slots);
  for (std::size_t p = 0; p < passes; ++p) {
    std::vector<std::int64_t> rows(E, 0);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t e = 0; e < E; ++e) rows[e] += std::int64_t(slots[(r * passes + p) * E + e]);
    std::vector<double> pass = shares_of(rows);
    if (pass.empty()) continue;
    if (shares.rows_per_pass == 0)
      for (std::int64_t x : rows) shares.rows_per_pass += x;
    shares.passes.push_back(std::move(pass));
  }
  if (shares.passes.empty()) shares.model.clear();
  return shares;
}

namespace {

bool fits_on_every_rank(const ModelSpec& m, int ranks_per_node) {
  const double pages = double(sysconf(_SC_PHYS_PAGES)), page = double(sysconf(_SC_PAGE_SIZE));
  if (pages <= 0 || page <= 0) return false;
  const double params = m.nonexpert_params() + m.expert_params();
  return 16.0 * params * double(std::max(1, ranks_per_node)) <= 0.25 * pages * page;
}

// 2 FLOPs per active parameter and token, one sequence a pass.
double forward_flops_per_rank(const ModelSpec& m, int seq_len) {
  const double active = m.nonexpert_params() + m.expert_params() * m.moe.top_k / std::max(1, m.moe.experts);
  return 2.0 * active * double(seq_len > 0 ? seq_len : m.seq_len) * kRoutingIterations;
}

std::string tflop(double flops) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", flops / 1e12);
  return buf;
}

}  // namespace

RoutingCount count_routing(const ModelSpec& model, int seq_len, int ranks_per_node) {
  RoutingCount count;
  if (!model.is_moe() || !model.moe.dropless()) return count;
  if (const double flops = forward_flops_per_rank(model, seq_len); flops > kRoutingFlopLimit) {
    count.skipped = "the step's forward passes would take " + tflop(flops) + " TFLOP a rank on the CPU (limit " +
                    tflop(kRoutingFlopLimit) + ")";
    return count;
  }
  if (!fits_on_every_rank(model, ranks_per_node)) {
    count.skipped = "model '" + model.name + "' is too large for every rank here to hold it";
    return count;
  }
  const std::unique_ptr<MpiCommunicator> world = MpiCommunicator::world();
  try {
    count.shares = measure_expert_shares(*world, model, seq_len, kRoutingIterations);
  } catch (const InputError& e) {
    count.skipped = "the training step does not run model '" + model.name + "': " + e.what();
  }
  return count;
}

}  // namespace tedsim::calibration
