// What a calibration measures: the model's shapes by default, a generic grid with --grid.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "tedsim/calibration/sweep.hpp"

namespace tedsim::calibration {
namespace {

ModelSpec model(const std::string& name) { return load_model(std::string(TEDSIM_SOURCE_DIR) + "/models/" + name + ".yaml"); }
TopologySpec local_cpu() { return load_topology(std::string(TEDSIM_SOURCE_DIR) + "/topologies/local-cpu.yaml"); }

std::set<std::tuple<long, long, long>> shapes(const Sweep& s) {
  std::set<std::tuple<long, long, long>> out;
  for (const GemmCase& g : s.gemms) out.insert({long(g.shape.m), long(g.shape.n), long(g.shape.k)});
  return out;
}

TEST(Sweep, ModelShapesFollowTheModelAndTheGridDoesNot) {
  SweepOptions o;
  o.gpus = o.world = 2;
  o.quick = true;
  const Sweep tiny = derive_sweep(model("tiny-moe"), local_cpu(), o);
  const Sweep other = derive_sweep(model("cpu-moe"), local_cpu(), o);
  EXPECT_NE(shapes(tiny), shapes(other));
  o.grid = true;
  const Sweep grid_tiny = derive_sweep(model("tiny-moe"), local_cpu(), o);
  const Sweep grid_other = derive_sweep(model("cpu-moe"), local_cpu(), o);
  EXPECT_EQ(shapes(grid_tiny), shapes(grid_other));
  EXPECT_TRUE(shapes(grid_tiny).count({64, 64, 64}));
  EXPECT_TRUE(shapes(grid_tiny).count({1024, 1024, 1024}));
  EXPECT_GT(grid_tiny.kernels.size(), tiny.kernels.size());
  // Collectives follow the TED groups of the world either way.
  EXPECT_EQ(grid_tiny.collectives.size(), tiny.collectives.size());
}

}  // namespace
}  // namespace tedsim::calibration
