// Runs on the profile the calibrate_quick_np2 test wrote (ctest passes its path): a real measured
// profile loads and drives the evaluator.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>

#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/search/evaluator.hpp"

namespace tedsim {
namespace {

std::string profile_path;

TEST(CalibratedProfile, LoadsAndEvaluatesTinyMoe) {
  const TopologySpec topo = load_topology(std::string(TEDSIM_SOURCE_DIR) + "/topologies/local-cpu.yaml");
  const ModelSpec model = load_model(std::string(TEDSIM_SOURCE_DIR) + "/models/tiny-moe.yaml");
  const std::unique_ptr<Profile> profile = load_profile(profile_path, topo);
  EXPECT_NE(profile->describe().find("measured"), std::string::npos);
  for (int tp : {1, 2}) {
    ParallelConfig c;
    c.gpus = 2;
    c.tp = tp;
    c.ep = 2 / tp;
    c.global_batch = 16;
    c.micro_batch = 1;
    validate_config(c, model);
    const Prediction pr = Evaluator(model, topo, *profile).evaluate(c);
    EXPECT_GT(pr.sim.iteration_s, 0);
    EXPECT_TRUE(std::isfinite(pr.sim.iteration_s));
    std::cout << c.describe() << ": " << pr.sim.iteration_s * 1e3 << " ms per iteration\n";
  }
  print_profile_warnings(std::cout, *profile);
}

}  // namespace
}  // namespace tedsim

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " PROFILE.json\n";
    return 2;
  }
  tedsim::profile_path = argv[1];
  return RUN_ALL_TESTS();
}
